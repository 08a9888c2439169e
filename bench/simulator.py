"""Simulator speed on the full shared trace: cluster mode and keep-alive study mode.

    python -m bench.simulator            # the table
    python -m bench.simulator --json

- cluster mode: one full day of 1,000 functions drawn by `occ_ref_samples` from both
  populations, on `medium`, kube-default placement with Knative's keep-alive (target <= 60 s);
- keep-alive study mode: all shared functions, fixed 10-minute and hybrid (target <= 30 s,
  trace loading included).
The full trace is read from `../shared/data/traces/azure2019_invitro` beside the repository
(or `--trace`); without it the benchmark says so and exits.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from policies import heuristics
from simulator import clusterspec, compare, engine, keepalive, study, traces, workload

REPOSITORY = Path(__file__).resolve().parent.parent
SHARED_TRACE = REPOSITORY.parent / "shared" / "data" / "traces" / "azure2019_invitro"


def trace_or_skip(path: Path) -> bool:
    """Whether the full trace is at `path`; says why the benchmark is skipped when it is not."""
    if (path / traces.INVOCATIONS).is_file():
        return True
    print(f"skipped: the full trace is not at {path} (pass --trace)", file=sys.stderr)
    return False


def cluster_mode(trace_path: Path, functions: int, seed: int) -> dict[str, object]:
    started = time.perf_counter()
    options = compare.Options(functions=functions, weighted=True, seed=seed)
    trace = compare.select(traces.load(trace_path), options)
    loaded = time.perf_counter()
    result = engine.Simulation(
        workload=workload.build(trace, seed=seed),
        counts=trace.counts,
        cluster=clusterspec.load("medium"),
        placement=heuristics.kube_default(),
        keepalive=keepalive.by_name("knative"),
        seed=seed,
    ).run()
    done = time.perf_counter()
    return {
        "benchmark": f"cluster mode, {len(trace)} functions by weight, 24 h, medium",
        "invocations": int(result.invocations.sum()),
        "pods_started": result.pods_started,
        "load_s": round(loaded - started, 2),
        "simulate_s": round(done - loaded, 2),
        "target": "total <= 60 s",
        "met": done - started <= 60,
    }


def keepalive_mode(trace_path: Path) -> dict[str, object]:
    started = time.perf_counter()
    trace = traces.load(trace_path)
    periods = study.IdlePeriods.from_counts(trace.counts)
    loaded = time.perf_counter()
    for name in ("fixed:10", "hybrid"):
        study.run(periods, keepalive.by_name(name))
    done = time.perf_counter()
    return {
        "benchmark": f"keep-alive study, all {len(trace)} functions, fixed:10 and hybrid",
        "invocations": int(trace.counts.sum()),
        "pods_started": None,
        "load_s": round(loaded - started, 2),
        "simulate_s": round(done - loaded, 2),
        "target": "total <= 30 s",
        "met": done - started <= 30,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=SHARED_TRACE)
    parser.add_argument("--functions", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not trace_or_skip(args.trace):
        return
    rows = [keepalive_mode(args.trace), cluster_mode(args.trace, args.functions, args.seed)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'benchmark':<62} {'invocations':>12} {'pods':>7} {'load s':>7} {'sim s':>7}  target")
    for r in rows:
        pods = "-" if r["pods_started"] is None else r["pods_started"]
        met = "met" if r["met"] else "MISSED"
        print(
            f"{r['benchmark']:<62} {r['invocations']:>12,} {pods:>7} {r['load_s']:>7} {r['simulate_s']:>7}  "
            f"{r['target']}: {met}"
        )


if __name__ == "__main__":
    main()
