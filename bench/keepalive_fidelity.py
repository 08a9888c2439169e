"""Does the hybrid histogram dominate fixed keep-alive, as SitW reports? (keep-alive study mode)

    python -m bench.keepalive_fidelity                   # table, and docs/keepalive-fidelity.png
    python -m bench.keepalive_fidelity --json

Per population, unweighted and weighted by `occ_ref_samples`: the 75th-percentile cold-start %
against wasted memory time (memory-weighted, fixed 10-minute keep-alive = 100) for fixed
keep-alive from 5 to 120 minutes and for the hybrid policy. The hybrid *dominates* when some
point of the fixed curve with no more wasted memory has no fewer cold starts is absent, i.e.
when, at the hybrid's wasted memory, the fixed curve (interpolated) has more cold starts.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from bench.simulator import REPOSITORY, SHARED_TRACE, trace_or_skip
from simulator import keepalive, report, study, traces

FIXED_MINUTES = (5, 10, 15, 20, 30, 45, 60, 90, 120)
PLOT = REPOSITORY / "docs" / "keepalive-fidelity.png"


def curves(trace: traces.Trace) -> list[dict[str, Any]]:
    rows = []
    populations = np.asarray(trace.populations)
    for population in traces.POPULATIONS:
        members = np.flatnonzero(populations == population)
        subset = trace.subset(members)
        periods = study.IdlePeriods.from_counts(subset.counts)
        memory = subset.memory_mb[:, 3]
        outcomes = {f"fixed:{m}": study.run(periods, keepalive.FixedKeepAlive(m)) for m in FIXED_MINUTES}
        outcomes["hybrid"] = study.run(periods, keepalive.HybridHistogramPolicy())
        for view in ("unweighted", "weighted"):
            weights = subset.weights if view == "weighted" else np.ones(len(subset))
            keep = weights > 0
            base = _wasted(outcomes["fixed:10"], memory, keep)
            for name, outcome in outcomes.items():
                pct = outcome.cold_start_pct[keep]
                rows.append(
                    {
                        "population": population,
                        "view": view,
                        "policy": name,
                        "cold_start_pct_p75": round(
                            report.weighted_percentile(pct, weights[keep], 75) or 0.0, 3
                        ),
                        "wasted_memory_norm": round(100.0 * _wasted(outcome, memory, keep) / base, 2),
                    }
                )
    return rows


def _wasted(outcome: study.Outcome, memory: np.ndarray, keep: np.ndarray) -> float:
    return float((outcome.wasted_minutes[keep] * memory[keep]).sum())


def verdicts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per population and view: which fixed keep-alives the hybrid dominates (fewer or equal
    cold starts and wasted memory), and whether any fixed one dominates the hybrid."""
    out = []
    for population in traces.POPULATIONS:
        for view in ("unweighted", "weighted"):
            group = [r for r in rows if r["population"] == population and r["view"] == view]
            hybrid = next(r for r in group if r["policy"] == "hybrid")
            fixed = [r for r in group if r["policy"] != "hybrid"]
            out.append(
                {
                    "population": population,
                    "view": view,
                    "hybrid": [hybrid["cold_start_pct_p75"], hybrid["wasted_memory_norm"]],
                    "hybrid_dominates": [r["policy"] for r in fixed if _dominates(hybrid, r)],
                    "dominate_hybrid": [r["policy"] for r in fixed if _dominates(r, hybrid)],
                }
            )
    return out


def _dominates(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = ("cold_start_pct_p75", "wasted_memory_norm")
    return all(a[k] <= b[k] for k in keys) and any(a[k] < b[k] for k in keys)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(10, 8))
    for i, population in enumerate(traces.POPULATIONS):
        for j, view in enumerate(("unweighted", "weighted")):
            axis = axes[i][j]
            group = [r for r in rows if r["population"] == population and r["view"] == view]
            fixed = sorted(
                (r for r in group if r["policy"] != "hybrid"), key=lambda r: r["wasted_memory_norm"]
            )
            axis.plot(
                [r["wasted_memory_norm"] for r in fixed],
                [r["cold_start_pct_p75"] for r in fixed],
                "o-",
                label="fixed keep-alive 5..120 min",
            )
            for r in fixed:
                axis.annotate(
                    r["policy"].removeprefix("fixed:"),
                    (r["wasted_memory_norm"], r["cold_start_pct_p75"]),
                    fontsize=7,
                    xytext=(2, 2),
                    textcoords="offset points",
                )
            hybrid = next(r for r in group if r["policy"] == "hybrid")
            axis.plot(
                hybrid["wasted_memory_norm"],
                hybrid["cold_start_pct_p75"],
                "r*",
                markersize=12,
                label="hybrid",
            )
            axis.set_title(f"{population}, {view}")
            axis.set_xlabel("wasted memory (fixed 10 min = 100)")
            axis.set_ylabel("p75 cold-start %")
            axis.grid(alpha=0.3)
            axis.legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=SHARED_TRACE)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not trace_or_skip(args.trace):
        return
    rows = curves(traces.load(args.trace))
    summary = verdicts(rows)
    plot(rows, PLOT)
    if args.json:
        print(json.dumps({"curves": rows, "verdicts": summary}, indent=1))
        return
    print(f"{'population':<7} {'view':<11} {'policy':<10} {'p75 cold %':>10} {'wasted (10 min = 100)':>22}")
    for r in rows:
        print(
            f"{r['population']:<7} {r['view']:<11} {r['policy']:<10} {r['cold_start_pct_p75']:>10} "
            f"{r['wasted_memory_norm']:>22}"
        )
    print()
    for v in summary:
        dominated = ", ".join(v["hybrid_dominates"]) or "none"
        dominating = ", ".join(v["dominate_hybrid"]) or "none"
        print(
            f"{v['population']:<6} {v['view']:<11} hybrid (cold %, wasted) = {v['hybrid']}; "
            f"it dominates {dominated}; dominated by {dominating}"
        )
    print(f"plot: {PLOT.relative_to(REPOSITORY)}")


if __name__ == "__main__":
    main()
