"""What a run measured, as the report's plain JSON fields (names other tools script against).

Cold-start percentages follow SitW: per function, cold starts / invocations; across functions,
the 75th percentile, unweighted and weighted by `occ_ref_samples` (the sampler's population
mix; functions it never weighted drop out of that view), and the mean, p50, p75 and p90 of
both views (`cold_start_pct`), since one percentile of the weighted view can sit at 100 % for
every policy. Wasted memory is memory x time of idle loaded instances, also normalised to
fixed 10-minute keep-alive = 100; in cluster mode its "paid" part (on the same scale) is what
keeps nodes up, the rest sits in room that busy nodes have anyway.

A cold request's start delay has two parts, reported apart: `cold_start_latency_*` is the
start-up itself (scheduling, image pull, container start, runtime init) and
`capacity_wait_*` the time its pod waited for a node with room; requests the activator gave
up on (`timed_out_requests`) are in neither, but count in each class's start delay and SLA.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from policies.objectives import SLA_TARGET_S
from simulator.engine import LATENCY_BIN_S, RunResult
from simulator.study import Outcome

FloatArray = npt.NDArray[np.float64]

# The comparison table (`kdrl simulate`'s terminal table and its HTML page): title, report key.
TABLE_COLUMNS = (
    ("placement", "placement"),
    ("keep-alive", "keepalive"),
    ("cold starts", "cold_starts"),
    ("p75 cold %", "cold_start_pct_p75"),
    ("cold % (w) mean/p50/p75/p90", "cold_start_pct"),
    ("wasted mem", "wasted_memory_norm"),
    ("paid wasted mem", "paid_wasted_memory_norm"),
    ("cold p50 s", "cold_start_latency_p50_s"),
    ("cold p99 s", "cold_start_latency_p99_s"),
    ("capacity wait p99 s", "capacity_wait_p99_s"),
    ("timeouts", "timed_out_requests"),
    ("CPU alloc", "cpu_alloc_utilization"),
    ("cost $", "cost_usd"),
    ("energy kWh", "energy_kwh"),
)


def cell(value: Any) -> str:
    """A report value as the table shows it."""
    if value is None:
        return "-"
    if isinstance(value, dict) and "weighted" in value:  # the cold-start % views
        return "/".join(cell(value["weighted"][q]) for q in ("mean", "p50", "p75", "p90"))
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def weighted_percentile(values: FloatArray, weights: FloatArray, q: float) -> float | None:
    """The q-th percentile of `values` with `weights` (None when no weight at all)."""
    at = weighted_percentile_index(values, weights, q)
    return None if at is None else float(values[at])


def weighted_percentile_index(values: FloatArray, weights: FloatArray, q: float) -> int | None:
    """Which of `values` is their q-th percentile with `weights` (None when no weight at all):
    with a few heavy weights, one entry can set it."""
    kept = np.flatnonzero(weights > 0)
    if not kept.size:
        return None
    order = kept[np.argsort(values[kept], kind="stable")]
    cumulative = np.cumsum(weights[order])
    index = int(np.searchsorted(cumulative, q / 100.0 * cumulative[-1], side="left"))
    return int(order[min(index, order.size - 1)])


def weighted_mean(values: FloatArray, weights: FloatArray) -> float | None:
    total = float(weights.sum())
    return float((values * weights).sum() / total) if total > 0 else None


def pct_view(pct: FloatArray, weights: FloatArray | None) -> dict[str, float | None]:
    """Mean, p50, p75 and p90 of per-function cold-start %, under `weights` (None: every
    function counts once, percentiles interpolated as SitW's)."""
    if weights is None:
        if not pct.size:
            return dict.fromkeys(("mean", "p50", "p75", "p90"))
        return {"mean": _round(float(pct.mean()))} | {
            f"p{q}": _round(float(np.percentile(pct, q))) for q in (50, 75, 90)
        }
    view: dict[str, float | None] = {"mean": _round(weighted_mean(pct, weights))}
    for q in (50, 75, 90):
        view[f"p{q}"] = _round(weighted_percentile(pct, weights, q))
    return view


def cold_start_summary(
    invocations: npt.NDArray[np.int64], cold_starts: npt.NDArray[np.int64], weights: FloatArray
) -> dict[str, Any]:
    invoked = invocations > 0
    pct = 100.0 * cold_starts[invoked] / invocations[invoked]
    views = {"unweighted": pct_view(pct, None), "weighted": pct_view(pct, weights[invoked])}
    return {
        "functions": int(invoked.sum()),
        "invocations": int(invocations.sum()),
        "cold_starts": int(cold_starts.sum()),
        "cold_start_pct_p75": views["unweighted"]["p75"],
        "cold_start_pct_p75_weighted": views["weighted"]["p75"],
        "cold_start_pct": views,
    }


def study_entry(outcome: Outcome, memory_mb: FloatArray, weights: FloatArray) -> dict[str, Any]:
    """The fields a keep-alive study run fills."""
    return {
        **cold_start_summary(outcome.invocations, outcome.cold_starts, weights),
        "wasted_memory_gb_s": _round(float((outcome.wasted_minutes * 60.0 * memory_mb).sum()) / 1024.0),
        "wasted_instance_s": _round(float(outcome.wasted_minutes.sum()) * 60.0),
    }


def cluster_entry(result: RunResult, weights: FloatArray, seconds: float) -> dict[str, Any]:
    """The fields a cluster-mode run fills."""
    latency = np.sum(list(result.latency_hist.values()), axis=0)
    series = result.series
    per_class = {}
    for priority, hist in result.latency_hist.items():
        warm = result.warm_requests[priority]
        target_bin = int(SLA_TARGET_S[priority] / LATENCY_BIN_S)
        total = warm + hist.sum()
        late = hist[target_bin:].sum()
        per_class[priority.value] = {
            "requests": int(total),
            "sla_target_s": SLA_TARGET_S[priority],
            "sla_violation_pct": _round(100.0 * late / total) if total else 0.0,
            "start_delay_p50_s": _round(_hist_percentile(hist, 50, zeros=warm)),
            "start_delay_p99_s": _round(_hist_percentile(hist, 99, zeros=warm)),
            "timed_out": result.timed_out[priority],
        }
    return {
        **cold_start_summary(result.invocations, result.cold_starts, weights),
        "wasted_memory_gb_s": _round(float(result.wasted_mb_s.sum()) / 1024.0),
        "paid_wasted_memory_gb_s": _round(float(result.paid_wasted_mb_s.sum()) / 1024.0),
        "cold_start_latency_p50_s": _round(_hist_percentile(result.startup_hist, 50)),
        "cold_start_latency_p99_s": _round(_hist_percentile(result.startup_hist, 99)),
        # A diagnostic: the tail without each function's first start of the run, which no
        # history foretells and whose image no node holds at the start (caches start empty).
        "cold_start_latency_p99_s_first_starts_out": _round(
            _hist_percentile(result.startup_hist - result.first_start_hist, 99)
        ),
        "capacity_wait_p50_s": _round(_hist_percentile(result.capacity_hist, 50)),
        "capacity_wait_p99_s": _round(_hist_percentile(result.capacity_hist, 99)),
        "start_delay_p50_s": _round(_hist_percentile(latency, 50)),
        "start_delay_p99_s": _round(_hist_percentile(latency, 99)),
        "sla_violation_pct": {name: c["sla_violation_pct"] for name, c in per_class.items()},
        "timed_out_requests": sum(result.timed_out.values()),
        "priority_classes": per_class,
        "cpu_alloc_utilization": _round(float(np.mean(series["cpu_allocation"]))),
        "memory_alloc_utilization": _round(float(np.mean(series["memory_allocation"]))),
        "nodes_mean": _round(float(np.mean(series["nodes"]))),
        "cost_usd": _round(result.cost_usd),
        "energy_kwh": _round(result.energy_j / 3.6e6),
        "by_pool": {
            name: {
                "cost_usd": _round(float(cost)),
                "energy_kwh": _round(float(energy) / 3.6e6),
                "energy_kwh_nodes_up": _round(float(up) / 3.6e6),  # idle: being up
            }
            for name, cost, energy, up in zip(
                result.pools, result.pool_cost_usd, result.pool_energy_j, result.pool_up_energy_j
            )
        },
        "pods_started": result.pods_started,
        "image_pulls": result.pulls,
        "prepulls": result.prepulls,
        "simulated_hours": _round(seconds / 3600.0),
    }


def normalise_wasted(entries: list[dict[str, Any]], reference: str = "fixed:10") -> None:
    """Add `wasted_memory_norm`: wasted memory with fixed 10-minute keep-alive = 100."""
    baseline = {
        (e["placement"], e["population"]): e["wasted_memory_gb_s"]
        for e in entries
        if e["keepalive"] == reference
    }
    for entry in entries:
        base = baseline.get((entry["placement"], entry["population"]))
        entry["wasted_memory_norm"] = _round(100.0 * entry["wasted_memory_gb_s"] / base) if base else None
        if "paid_wasted_memory_gb_s" in entry:  # cluster mode: on the same scale as the total
            paid = entry["paid_wasted_memory_gb_s"]
            entry["paid_wasted_memory_norm"] = _round(100.0 * paid / base) if base else None


def _hist_percentile(hist: FloatArray, q: float, zeros: int = 0) -> float | None:
    total = hist.sum() + zeros
    if total == 0:
        return None
    rank = q / 100.0 * total
    if rank <= zeros:
        return 0.0
    index = int(np.searchsorted(np.cumsum(hist), rank - zeros, side="left"))
    return (index + 0.5) * LATENCY_BIN_S


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 6)
