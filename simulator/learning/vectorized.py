"""The environments a PPO update steps together, wherever they run.

`LocalEnvironments` steps them in this process (gymnasium's `SyncVectorEnv`: the simulator is
pure Python); `plugin.ray_rollouts.RayEnvironments` splits them over Ray actors, each holding a
`LocalEnvironments` of consecutive indices. Environment i draws its episodes from its own
generator, seeded `seed + i`, and the curriculum's progress is the only state they share, set
by the learner; so environments split over workers step exactly as they do together, and the
same seed trains the same model with any number of workers (tests/test_ray_rollouts.py).
"""

from __future__ import annotations

from typing import Any, Protocol, cast

import gymnasium as gym
import numpy as np

from policies import heuristics
from policies.placement import PlacementPolicy
from simulator import clusterspec, engine, traces
from simulator.learning import environment
from simulator.learning.config import Args
from simulator.lookahead import Lookahead

Observations = dict[str, np.ndarray]


class Environments(Protocol):
    """`num_envs` placement environments stepped as one (observations stacked on axis 0)."""

    num_envs: int
    rows: int  # node rows of an observation

    def reset(self, seed: int) -> Observations: ...

    def step(self, actions: np.ndarray) -> tuple[Observations, np.ndarray, np.ndarray]:
        """Observations, rewards and whether each episode finished (the next one is already
        started: its first observation is the one returned)."""
        ...

    def teach(self, share: float = 1.0) -> np.ndarray:
        """The teacher's (`Args.imitate`) choice for each pending placement, or -1 for those it
        leaves out: each is labelled with probability `share`."""
        ...

    def set_progress(self, progress: float) -> None:
        """The share of training done, which sets the curriculum's stage."""
        ...

    def close(self) -> None: ...


def scenarios(args: Args, trace: traces.Trace) -> environment.Scenarios:
    return environment.Scenarios(
        trace=trace,
        shapes=clusterspec.load(args.shapes).pools,
        curriculum=environment.Curriculum.up_to(
            args.largest_cluster, args.episode_minutes, args.fewest_functions_per_node
        ),
        max_arrival_scale=args.max_arrival_scale,
        drain_underused=args.drain_underused,
    )


def teacher(args: Args) -> PlacementPolicy | Lookahead | None:
    """`Args.imitate`'s teacher. The lookahead plays the residual base's candidates forward
    under the base (tuned without a residual)."""
    if not args.imitate:
        return None
    if args.imitate == "lookahead":
        return Lookahead(
            heuristics.by_name(args.residual or "tuned"),
            candidates=args.lookahead_candidates,
            horizon_minutes=args.lookahead_minutes,
            margin=args.lookahead_margin,
        )
    # Straight from the heuristics: a registry fallback would have it clone kube-default silently.
    return heuristics.by_name(args.imitate, seed=args.seed)


class LocalEnvironments:
    """Environments `first` .. `first + count - 1` of a run, in this process."""

    def __init__(self, args: Args, trace: traces.Trace, first: int = 0, count: int | None = None) -> None:
        self.first = first
        self.num_envs = args.num_envs if count is None else count
        self.scenarios = scenarios(args, trace)
        base = args.residual_base()
        self.rows = base.top_k if base is not None and base.top_k else self.scenarios.max_rows
        self.teacher = teacher(args)
        # Which placements the teacher labels: a generator per environment, as its episodes.
        self.teach_draws = [np.random.default_rng([args.seed, first + i, 2]) for i in range(self.num_envs)]
        gamma = args.gamma_per_second or args.gamma
        shaping = gamma if args.shape_reward else None

        def make() -> gym.Env[Any, Any]:
            return environment.PlacementEnv(
                self.scenarios.draw,
                self.rows,
                shaping_gamma=shaping,
                base=base,
                future=args.critic_sees_future,
                clock=args.gamma_per_second > 0,
                request_weighted_qos=args.request_weighted_qos,
                capacity_qos=args.capacity_qos,
            )

        self.envs = gym.vector.SyncVectorEnv(
            [make for _ in range(self.num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
        )

    def reset(self, seed: int) -> Observations:
        observations: Observations = self.envs.reset(seed=seed + self.first)[0]  # environment i: seed + i
        return observations

    def step(self, actions: np.ndarray) -> tuple[Observations, np.ndarray, np.ndarray]:
        observations, reward, terminated, truncated, _ = self.envs.step(actions)
        return observations, np.asarray(reward, dtype=np.float64), np.logical_or(terminated, truncated)

    def teach(self, share: float = 1.0) -> np.ndarray:
        if self.teacher is None:
            raise ValueError("no teacher: Args.imitate is empty")
        labels = np.full(self.num_envs, -1, dtype=np.int64)
        for i, env in enumerate(self.envs.envs):
            e = cast(environment.PlacementEnv, env.unwrapped)
            if e.decision is None or (share < 1.0 and self.teach_draws[i].random() >= share):
                continue
            if isinstance(self.teacher, Lookahead):
                labels[i] = e.action_for(e.look_ahead(self.teacher))
            else:
                labels[i] = e.action_for(engine.best_row(self.teacher, e.decision))
        return labels

    def set_progress(self, progress: float) -> None:
        self.scenarios.progress = progress

    def close(self) -> None:
        self.envs.close()
