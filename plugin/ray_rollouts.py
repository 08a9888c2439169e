"""Training's environments in Ray actors (`kdrl train --ray-address ADDR --workers N`).

Each actor holds a `LocalEnvironments` of consecutive environment indices and steps them in
its own process; the learner (`kdrl train`'s process) samples actions for all of them, sends
each actor its share and stacks what comes back. An update waits for the slowest actor at every
step, so actors get equal shares. The trace travels once, through Ray's object store, so the
workers need the image (the package), not the trace file.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from plugin.ray_engine import connect
from simulator import traces
from simulator.learning import vectorized
from simulator.learning.config import Args
from simulator.learning.vectorized import LocalEnvironments, Observations


class RayEnvironments:
    def __init__(self, args: Args, trace: traces.Trace, *, address: str, workers: int) -> None:
        import ray

        if not 1 <= workers <= args.num_envs:
            raise ValueError(f"--workers must be 1 to --num-envs ({args.num_envs}), not {workers}")
        connect(address)
        actor: Any = ray.remote(num_cpus=1)(LocalEnvironments)
        shares = np.array_split(np.arange(args.num_envs), workers)
        shared = ray.put(trace)
        self.actors = [actor.remote(args, shared, int(share[0]), len(share)) for share in shares]
        self.bounds = np.cumsum([0, *(len(share) for share in shares)])
        self.num_envs = args.num_envs
        self.rows = vectorized.scenarios(args, trace).max_rows

    def _all(self, method: str, *args_per_actor: Any) -> list[Any]:
        import ray

        calls = [
            getattr(actor, method).remote(*(a[i] for a in args_per_actor))
            for i, actor in enumerate(self.actors)
        ]
        return list(ray.get(calls))

    def reset(self, seed: int) -> Observations:
        return _stack(self._all("reset", [seed] * len(self.actors)))

    def step(self, actions: np.ndarray) -> tuple[Observations, np.ndarray, np.ndarray]:
        shares = [actions[lo:hi] for lo, hi in zip(self.bounds[:-1], self.bounds[1:])]
        results = self._all("step", shares)
        observations = _stack([r[0] for r in results])
        return observations, np.concatenate([r[1] for r in results]), np.concatenate([r[2] for r in results])

    def teach(self, share: float = 1.0) -> np.ndarray:
        return np.concatenate(self._all("teach", [share] * len(self.actors)))

    def set_progress(self, progress: float) -> None:
        self._all("set_progress", [progress] * len(self.actors))

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor)


def _stack(parts: list[Observations]) -> Observations:
    return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}
