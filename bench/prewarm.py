"""The prewarm planner against Knative's default, fixed keep-alive and the hybrid histogram.

    python -m bench.prewarm                    # markdown table, and docs/prewarm.png
    python -m bench.prewarm --json

Cluster mode on `medium` with the bundled trace slice (both populations, one day), placement
kube-default, seed 1 (`--seed` for others). Per population: the 75th-percentile cold-start %
over all functions and over those prewarming serves before the rest (not `batch`, which gets
what the others leave), weighted by `occ_ref_samples` too, and, as a diagnostic beside the
goals, with each function's first call of the trace left out where it is counted (no policy
has history before it: a one-day trace's floor that a service running for days would not
have); wasted memory time (fixed 10-minute keep-alive = 100) and its "paid" part, the idle
memory that keeps nodes up; cold-start latency p50/p99 (the start-up, image pulls included;
the p99 also without each function's first start of the run, in brackets: no node holds its
image then) and the p99 wait for capacity apart, and timed-out requests; image pulls ahead of
pods; cost and energy. About 3.5 minutes on 2 cores (the forecasts run once, beside the other runs).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.simulator import REPOSITORY
from policies.types import Priority
from simulator import compare, report, traces
from simulator.plots import save

KEEPALIVES = ("knative", "fixed:10", "hybrid", "prewarm", "prewarm:nopull")
PLOT = REPOSITORY / "docs" / "prewarm.png"
WARMUP_HELP = "minutes run but not counted (720: the last 12 hours, with the first 12 as history)"


def measure(
    seed: int,
    workers: int,
    *,
    trace: Path = compare.BUNDLED_TRACE,
    functions: int | None = None,
    keepalives: tuple[str, ...] = KEEPALIVES,
    warmup_minutes: int = compare.Options.warmup_minutes,
    drain_underused: bool = False,
) -> dict[str, Any]:
    """One selection (the trace's functions, or a seeded `functions` of them), one day.

    The first `warmup_minutes` run but are not counted: 720 measures the last 12 hours of a
    service that has the first 12 as history. `drain_underused`: the cluster autoscaler also
    drains nodes under half allocated (the placement evaluation's ground).
    """
    options = compare.Options(
        trace=trace,
        functions=functions,
        placements=("kube-default",),
        keepalives=keepalives,
        cluster="medium",
        seed=seed,
        workers=workers,
        warmup_minutes=warmup_minutes,
        drain_underused=drain_underused,
    )
    compared = compare.compare(options)
    per_function = compared["per_function"]
    eligible = np.asarray(per_function["priorities"]) != Priority.BATCH.value
    populations = np.asarray(per_function["populations"])
    invocations = np.asarray(per_function["invocations"])
    weights = np.asarray(per_function["weights"])
    first_call_counted = np.asarray(per_function["first_call_counted"])
    rows = []
    for entry in compared["results"]:
        cold = np.asarray(per_function["cold_starts"][f"kube-default x {entry['keepalive']}"])
        pct = 100.0 * cold / np.maximum(invocations, 1)
        cold_first_calls_out = cold - (first_call_counted & (cold > 0))  # no history before it
        first_starts_out = entry["cold_start_latency_p99_s_first_starts_out"]
        for population in traces.POPULATIONS:
            members = (populations == population) & (invocations > 0)
            summary = entry["populations"][population]
            first_calls_out = report.cold_start_summary(
                invocations[members], cold_first_calls_out[members], weights[members]
            )
            rows.append(
                {
                    "keepalive": entry["keepalive"],
                    "population": population,
                    "p75_cold_pct": summary["cold_start_pct_p75"],
                    "p75_cold_pct_weighted": summary["cold_start_pct_p75_weighted"],
                    "p75_cold_pct_prewarmable": round(float(np.percentile(pct[members & eligible], 75)), 3),
                    "p75_cold_pct_first_calls_out": first_calls_out["cold_start_pct_p75"],
                    "p75_cold_pct_first_calls_out_weighted": first_calls_out["cold_start_pct_p75_weighted"],
                    "p75_weighted_set_by": weighted_p75_setter(per_function, members, pct, weights, cold),
                    "wasted_memory_norm": entry["wasted_memory_norm"],  # the whole cluster
                    "paid_wasted_memory_norm": entry["paid_wasted_memory_norm"],
                    "cold_latency_p50_s": entry["cold_start_latency_p50_s"],
                    "cold_latency_p99_s": entry["cold_start_latency_p99_s"],
                    "cold_latency_p99_first_starts_out_s": first_starts_out or 0.0,  # None: no others
                    "capacity_wait_p99_s": entry["capacity_wait_p99_s"],
                    "timed_out_requests": entry["timed_out_requests"],
                    "cold_requests": entry["cold_starts"],
                    "prepulls": entry["prepulls"],
                    "cost_usd": round(entry["cost_usd"], 1),
                    "energy_kwh": round(entry["energy_kwh"], 1),
                }
            )
    return {"seed": seed, "warmup_minutes": warmup_minutes, "rows": rows}


def weighted_p75_setter(
    per_function: dict[str, Any],
    members: npt.NDArray[np.bool_],
    pct: npt.NDArray[np.float64],
    weights: npt.NDArray[np.float64],
    cold: npt.NDArray[np.int64],
) -> dict[str, Any] | None:
    """The function whose cold-start % (`pct`) is `members`' weighted p75, and what it is: with
    the sampler's weights a few rarely called functions can carry most of a population's weight."""
    rows = np.flatnonzero(members)
    at = report.weighted_percentile_index(pct[rows], weights[rows], 75)
    if at is None:
        return None
    row = int(rows[at])
    return {
        "function": per_function["func_ids"][row],
        "calls": per_function["invocations"][row],
        "cold": int(cold[row]),
        "weight_share": round(float(weights[row] / weights[rows].sum()), 3),
        "memory_mb": per_function["memory_mb"][row],
        "gpus": per_function["gpus"][row],
        "priority": per_function["priorities"][row],
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| population | keep-alive | p75 cold % | p75 cold % (weighted) | p75 cold % (prewarmable) "
        "| p75 cold %, first calls out (weighted) | wasted memory | paid wasted memory "
        "| cold p50 s | cold p99 s (first starts out) | capacity p99 s | timeouts "
        "| pre-pulls | cost $ | energy kWh |"
    )
    lines = [head, "|" + " --- |" * 15]
    for r in rows:
        lines.append(
            f"| {r['population']} | {r['keepalive']} | {r['p75_cold_pct']:.3g} "
            f"| {r['p75_cold_pct_weighted']:.3g} | {r['p75_cold_pct_prewarmable']:.3g} "
            f"| {r['p75_cold_pct_first_calls_out']:.3g} ({r['p75_cold_pct_first_calls_out_weighted']:.3g}) "
            f"| {r['wasted_memory_norm']:.1f} | {r['paid_wasted_memory_norm']:.1f} "
            f"| {r['cold_latency_p50_s']:.3g} "
            f"| {r['cold_latency_p99_s']:.3g} ({r['cold_latency_p99_first_starts_out_s']:.3g}) "
            f"| {r['capacity_wait_p99_s']:.3g} | {r['timed_out_requests']} "
            f"| {r['prepulls']} | {r['cost_usd']:,} | {r['energy_kwh']} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    colours = {k: f"C{i}" for i, k in enumerate(KEEPALIVES)}
    for axis, population in zip(axes, traces.POPULATIONS):
        for r in (r for r in rows if r["population"] == population):
            x, colour = r["wasted_memory_norm"], colours.get(r["keepalive"], "black")
            axis.scatter(x, r["p75_cold_pct"], marker="o", color=colour, label=r["keepalive"])
            axis.scatter(x, r["p75_cold_pct_prewarmable"], marker="x", color=colour)
        axis.set_title(f"{population} functions (medium cluster, kube-default)")
        axis.set_xlabel("wasted memory time (fixed 10-min keep-alive = 100)")
        axis.set_ylabel("p75 cold-start % (o all, x prewarmable)")
        axis.grid(alpha=0.3)
    axes[1].legend(fontsize=7, title="keep-alive", title_fontsize=7)
    return save(figure, path)


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument(
        "--warmup-minutes", type=int, default=compare.Options.warmup_minutes, help=WARMUP_HELP
    )
    parser.add_argument("--drain-underused", action="store_true", help=compare.DRAIN_UNDERUSED_HELP)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--plot", type=Path, default=PLOT)
    args = parser.parse_args()
    result = measure(
        args.seed, args.workers, warmup_minutes=args.warmup_minutes, drain_underused=args.drain_underused
    )
    drawn = plot(result["rows"], args.plot)
    print(json.dumps(result, indent=2) if args.json else f"{table(result['rows'])}\n\nplot: {drawn}")


if __name__ == "__main__":
    main()
