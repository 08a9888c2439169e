"""Simulator speed: a simulated day on `large` for 1,000 and for every shared function, the
keep-alive study, and the default `kdrl evaluate` run.

    python -m bench.simulator                  # the table
    python -m bench.simulator --no-evaluate    # without the ~30-minute evaluation
    python -m bench.simulator --json

- cluster mode: one full day on `large`, kube-default placement with Knative's keep-alive, of
  1,000 functions drawn by `occ_ref_samples` from both populations (target <= 60 s) and of all
  functions of the shared trace (6,466; target <= 8 minutes);
- keep-alive study mode: all shared functions, fixed 10-minute and hybrid (target <= 30 s,
  trace loading included);
- `kdrl evaluate` with its defaults (bundled slice, 3 clusters and the shifted ground, 10 seeds,
  every policy; target <= 30 minutes on 2 cores).
The full trace is read from `../shared/data/traces/azure2019_invitro` beside the repository
(or `--trace`); without it the trace rows are skipped with a message and the evaluation runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from policies import heuristics
from simulator import compare, evaluation, keepalive, study, traces

REPOSITORY = Path(__file__).resolve().parent.parent
SHARED_TRACE = REPOSITORY.parent / "shared" / "data" / "traces" / "azure2019_invitro"


def trace_or_skip(path: Path) -> bool:
    """Whether the full trace is at `path`; says why the benchmark is skipped when it is not."""
    if (path / traces.INVOCATIONS).is_file():
        return True
    print(f"skipped: the full trace is not at {path} (pass --trace)", file=sys.stderr)
    return False


def cluster_mode(
    trace_path: Path, functions: int | None, seed: int, cluster: str = "large"
) -> dict[str, object]:
    started = time.perf_counter()
    options = compare.Options(functions=functions, weighted=functions is not None, seed=seed, cluster=cluster)
    trace = compare.select(traces.load(trace_path), options)
    loaded = time.perf_counter()
    result = evaluation.simulate(trace, cluster, seed, heuristics.kube_default())
    done = time.perf_counter()
    limit = 60 if functions is not None and functions <= 1000 else 480
    drawn = "by weight" if functions is not None else "(all)"
    return {
        "benchmark": f"cluster mode, {len(trace):,} functions {drawn}, 24 h, {cluster}",
        "invocations": int(result.invocations.sum()),
        "pods_started": result.pods_started,
        "load_s": round(loaded - started, 2),
        "simulate_s": round(done - loaded, 2),
        "target": f"total <= {limit} s",
        "met": done - started <= limit,
    }


def evaluate_default(workers: int) -> dict[str, object]:
    started = time.perf_counter()
    result = evaluation.evaluate(compare.BUNDLED_TRACE, workers=workers)
    done = time.perf_counter()
    runs = sum(entry["seeds"] for entry in result["results"])
    return {
        "benchmark": f"kdrl evaluate defaults ({runs} runs of 12 h, {workers or 'all'} workers)",
        "invocations": None,
        "pods_started": None,
        "load_s": 0.0,
        "simulate_s": round(done - started, 2),
        "target": "total <= 1800 s",
        "met": done - started <= 1800,
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
    parser.add_argument("--workers", type=int, default=0, help="evaluation worker processes (0: one per CPU)")
    parser.add_argument("--no-evaluate", action="store_true", help="skip the default kdrl evaluate run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    if trace_or_skip(args.trace):
        rows += [
            keepalive_mode(args.trace),
            cluster_mode(args.trace, args.functions, args.seed),
            cluster_mode(args.trace, None, args.seed),
        ]
    if not args.no_evaluate:
        rows.append(evaluate_default(args.workers))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'benchmark':<66} {'invocations':>12} {'pods':>8} {'load s':>7} {'sim s':>8}  target")
    for r in rows:
        pods = "-" if r["pods_started"] is None else f"{r['pods_started']:,}"
        invocations = "-" if r["invocations"] is None else f"{r['invocations']:,}"
        met = "met" if r["met"] else "MISSED"
        print(
            f"{r['benchmark']:<66} {invocations:>12} {pods:>8} {r['load_s']:>7} {r['simulate_s']:>8}  "
            f"{r['target']}: {met}"
        )


if __name__ == "__main__":
    main()
