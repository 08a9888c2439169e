"""Training throughput: placements per second with the environments in this process or in
Ray actors (`kdrl train --ray-address ADDR --workers N`).

    python -m bench.training                               # in-process, ray:1, ray:2
    python -m bench.training --engines local,ray:2 --updates 3

Each row is a fresh run of the same configuration (the default `Args`, its seed included, a few
updates of `num_envs x num_steps` placements): PPO as `kdrl train` runs it (rollouts and updates;
placements per second of wall time after the first update, so Ray's start is left out), and
the environments alone, stepped with the first feasible node (the rollouts without the learner).
`ray:N` starts a local Ray of N CPUs with N actors: on one machine, the learner and the actors
share its cores.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from simulator import traces
from simulator.learning import ppo
from simulator.learning.config import Args
from simulator.learning.vectorized import Environments, LocalEnvironments


def environments(name: str, args: Args) -> Environments:
    trace = traces.load(args.trace)
    if name == "local":
        return LocalEnvironments(args, trace)
    import ray

    from plugin.ray_rollouts import RayEnvironments

    workers = int(name.partition(":")[2] or 2)
    ray.shutdown()  # each row its own Ray, of its own size
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    address = str(ray.get_runtime_context().gcs_address)
    return RayEnvironments(args, trace, address=address, workers=workers)


def stepping(envs: Environments, steps: int, seed: int) -> float:
    """Placements per second, each environment placing on its first feasible node."""
    observations = envs.reset(seed)
    envs.step(observations["mask"].argmax(axis=1))  # warm-up: the first step of every actor
    started = time.perf_counter()
    for _ in range(steps):
        observations, _, _ = envs.step(observations["mask"].argmax(axis=1))
    return steps * envs.num_envs / (time.perf_counter() - started)


def row(name: str, updates: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as out:
        args = Args(out=Path(out), time_budget_s=0, export_onnx=False)
        args = dataclasses.replace(args, total_timesteps=updates * args.batch_size)
        envs = environments(name, args)
        alone = stepping(envs, args.num_steps, args.seed)
        envs.close()
        ppo.train(args, environments=environments(name, args))
        with (Path(out) / "progress.csv").open() as handle:
            first, *_, last = csv.DictReader(handle)
    # From the end of the first update on: Ray's start and the actors' first steps left out.
    placements = float(last["global_step"]) - float(first["global_step"])
    return {
        "environments": name,
        "placements": int(placements),
        "train_placements_per_s": round(placements / (float(last["wall_s"]) - float(first["wall_s"])), 1),
        "environments_alone_per_s": round(alone, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="local,ray:1,ray:2", help="local, ray:N; comma-separated")
    parser.add_argument("--updates", type=int, default=3, help="PPO updates per row (the first is not timed)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [row(name, args.updates) for name in args.engines.split(",")]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    base = next((r for r in rows if r["environments"] == "local"), rows[0])
    print(
        "| environments | placements | kdrl train placements/s | x local | environments alone /s | x local |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        train = r["train_placements_per_s"] / base["train_placements_per_s"]
        alone = r["environments_alone_per_s"] / base["environments_alone_per_s"]
        print(
            f"| {r['environments']} | {r['placements']:,} | {r['train_placements_per_s']} | {train:.2f} "
            f"| {r['environments_alone_per_s']} | {alone:.2f} |"
        )


if __name__ == "__main__":
    main()
