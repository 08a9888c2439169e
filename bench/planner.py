"""The prewarm planner's cycle at scale: a forecast cycle and the allocation, for N functions.

    python -m bench.planner                                  # 10,000 functions on 1,000 nodes
    python -m bench.planner --functions 1000,10000 --nodes 1000 --json

What `kdrl serve` does for prewarming, timed apart: the forecast cycle (statsforecast's chosen
models, the idle-time hazards and the phase answers, after the hourly model choice, which is
not in the cycle) and the planner's allocation (the choice between the idle-time and the phase
answer by their losses, `forecaster.phase.Scores`, judging the answers of three minutes
before; then `prewarm.planning.plan`: every function's benefit and cost, the
global memory budget spent highest benefit per byte first, pre-pulls onto the placement
policy's top nodes), on this process's cores. Histories are the shared Azure rows' first 12
hours repeated to N functions (seeded synthetic ones when the trace is absent), the functions'
priorities, memory and images are drawn with a fixed seed, the cluster is `bench.synthetic`'s.
Targets (issue 16): allocation <= 1 s and forecast + allocation <= 10 s at 10,000 functions.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from bench import synthetic
from bench.forecaster import END, _counts
from forecaster import phase
from forecaster.forecasting import Forecaster
from plugin.cluster import ClusterCache
from plugin.convert import SERVICE_LABEL
from policies import heuristics
from policies.types import NodeTable, PodRequest, Priority
from prewarm.planning import Budget, FunctionState, PlannerSettings, plan

GiB = 1 << 30
MiB = 1 << 20


def states(names: list[str], seed: int = 0) -> dict[str, FunctionState]:
    """Seeded function facts: priorities as the simulator draws them, 128 MiB-2 GiB pods."""
    rng = np.random.default_rng(seed)
    priorities = list(Priority)
    out = {}
    for i, name in enumerate(names):
        memory = int(rng.choice((128, 256, 512, 1024, 2048))) * MiB
        namespace, function = name.split("/", 1)
        pod = PodRequest(
            namespace=namespace,
            name=f"{function}-pod",
            cpu_milli=int(rng.choice((100, 250, 500, 1000))),
            memory_bytes=memory,
            images=(synthetic.image_ref(i % 120),),
            function=name,
            priority=priorities[int(rng.integers(len(priorities)))],
        )
        out[name] = FunctionState(
            function=name,
            priority=pod.priority,
            memory_bytes=memory,
            cold_start_s=float(rng.uniform(2.0, 12.0)),
            pod=pod,
        )
    return out


def cluster(nodes: int, functions: Sequence[str]) -> NodeTable:
    """`bench.synthetic`'s cluster, each of its pods given to the next of `functions` in turn, so
    that the allocation weighs the planned functions' own pods (which of them alone keep a node
    up), as it would in a cluster that runs them."""
    node_objects, pods = synthetic.cluster(nodes, seed=nodes)
    for pod, function in zip(pods, itertools.cycle(functions), strict=False):
        pod["metadata"]["namespace"], pod["metadata"]["labels"][SERVICE_LABEL] = function.split("/", 1)
    return ClusterCache.from_objects(node_objects, pods).snapshot.nodes


def cycle(functions: int, nodes: int, repeats: int) -> dict[str, Any]:
    forecaster = Forecaster(_counts(functions))
    forecaster.forecast(END, horizon=30)  # warm-up: numba compiles here, not in the cycle
    forecaster.choose(END, horizon=30)  # hourly, in the background: not part of the cycle
    forecast_s, forecasts = [], {}
    for _ in range(repeats):
        started = time.perf_counter()
        forecasts = forecaster.forecast(END, horizon=30)
        forecast_s.append(time.perf_counter() - started)
    names = sorted(forecasts)
    table, known = cluster(nodes, names), states(names)
    allocation_s, warm = [], 0
    budget, settings = Budget(warm_memory_bytes=64 * GiB, pulls_per_minute=20), PlannerSettings()
    earlier = {
        f: replace(made, start_minute=int(END) - settings.lookahead_minutes) for f, made in forecasts.items()
    }
    judged = phase.Scores()
    judged.choose(earlier, settings.lookahead_minutes)  # answers for the timed cycle to judge
    for _ in range(repeats):
        scores = copy.deepcopy(judged)
        started = time.perf_counter()
        chosen = scores.choose(forecasts, settings.lookahead_minutes)
        decided = plan(int(END), chosen, known, table, budget, policy=heuristics.tuned(), settings=settings)
        allocation_s.append(time.perf_counter() - started)
        warm = len(decided.warm)
    forecast, allocation = statistics.median(forecast_s), statistics.median(allocation_s)
    return {
        "functions": len(forecasts),
        "nodes": len(table),
        "forecast s": round(forecast, 2),
        "allocation s": round(allocation, 3),
        "cycle s": round(forecast + allocation, 2),
        "warm functions": warm,
        "allocation target met (<= 1 s)": allocation <= 1.0 if functions >= 10_000 else None,
        "cycle target met (<= 10 s)": forecast + allocation <= 10.0 if functions >= 10_000 else None,
    }


def _sizes(text: str) -> list[int]:
    sizes = [int(part) for part in text.split(",") if part]
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--functions: positive counts, comma-separated, not {text!r}")
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--functions", type=_sizes, default=[10_000])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3, help="cycles timed per size (the median is shown)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.nodes < 1 or args.repeats < 1:
        parser.error("--nodes and --repeats must be positive")
    rows = [cycle(n, args.nodes, args.repeats) for n in args.functions]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("| " + " | ".join("---" for _ in keys) + " |")
    for row in rows:
        print("| " + " | ".join("" if row[k] is None else str(row[k]) for k in keys) + " |")


if __name__ == "__main__":
    main()
