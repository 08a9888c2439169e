"""PNG plots of a report: the cold-start / wasted-memory Pareto and the cluster over time."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.lines import Line2D


def write_all(report: dict[str, Any], out: Path) -> list[Path]:
    paths = [pareto(report["results"], out / "pareto.png")]
    if report.get("per_function", {}).get("weights") is not None:
        paths.append(cold_start_cdf(report["per_function"], out / "cold_start_cdf.png"))
    if any(report["series"].values()):
        paths.append(timeline(report["series"], out / "timeline.png"))
    return paths


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")


def _styles(results: list[dict[str, Any]]) -> tuple[dict[Any, str], dict[str, str]]:
    """One colour per placement, one marker per keep-alive."""
    placements = list(dict.fromkeys(e["placement"] for e in results))
    keepalives = list(dict.fromkeys(e["keepalive"] for e in results))
    colours = {p: f"C{i % 10}" for i, p in enumerate(placements)}
    return colours, {k: MARKERS[i % len(MARKERS)] for i, k in enumerate(keepalives)}


def pareto(results: list[dict[str, Any]], path: Path) -> Path:
    """75th-percentile cold-start % against wasted memory (fixed 10-minute keep-alive = 100):
    unweighted on the left, weighted by `occ_ref_samples` on the right; a legend, no labels
    on the points (they overlap)."""
    colours, markers = _styles(results)
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharex=True)
    views = (
        ("cold_start_pct_p75", "unweighted"),
        ("cold_start_pct_p75_weighted", "weighted by occ_ref_samples"),
    )
    for axis, (key, title) in zip(axes, views):
        for entry in results:
            x, y = entry.get("wasted_memory_norm"), entry.get(key)
            if x is not None and y is not None:
                axis.scatter(
                    x, y, color=colours[entry["placement"]], marker=markers[entry["keepalive"]], s=40
                )
        axis.set_title(f"p75 cold-start %, {title}", fontsize=10)
        axis.set_xlabel("wasted memory time (fixed 10-min keep-alive = 100)")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("75th-percentile cold-start %")
    handles = [
        Line2D([], [], color=colour, marker="o", linestyle="", label=str(placement or "no cluster"))
        for placement, colour in colours.items()
    ] + [Line2D([], [], color="grey", marker=marker, linestyle="", label=k) for k, marker in markers.items()]
    axes[1].legend(
        handles=handles,
        fontsize=7,
        loc="best",
        title="placement (colour), keep-alive (marker)",
        title_fontsize=7,
    )
    return save(figure, path)


def cold_start_cdf(per_function: dict[str, Any], path: Path) -> Path:
    """CDF of per-function cold-start % for each run, as "Serverless in the Wild" plots it:
    unweighted (each function counts once) and weighted by `occ_ref_samples`."""
    invocations = np.asarray(per_function["invocations"], dtype=np.float64)
    weights = np.asarray(per_function["weights"], dtype=np.float64)
    invoked = invocations > 0
    labels = list(per_function["cold_starts"])
    placements = list(dict.fromkeys(label.split(" x ")[0] for label in labels))
    keepalives = list(dict.fromkeys(label.split(" x ")[-1] for label in labels))
    styles = ("-", "--", ":", "-.", (0, (5, 1)), (0, (3, 1, 1, 1)))
    figure, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
    for label, cold in per_function["cold_starts"].items():
        pct = 100.0 * np.asarray(cold, dtype=np.float64)[invoked] / invocations[invoked]
        placement, keepalive = label.split(" x ")[0], label.split(" x ")[-1]
        style = {
            "color": f"C{placements.index(placement) % 10}",
            "linestyle": styles[keepalives.index(keepalive) % len(styles)],
            "linewidth": 1.2,
        }
        for axis, w in zip(axes, (np.ones(pct.size), weights[invoked])):
            order = np.argsort(pct, kind="stable")
            cumulative = np.cumsum(w[order])
            if cumulative.size and cumulative[-1] > 0:
                axis.step(pct[order], cumulative / cumulative[-1], where="post", label=label, **style)
    for axis, title in zip(axes, ("unweighted", "weighted by occ_ref_samples")):
        axis.set_xlabel("cold-start % of a function's invocations")
        axis.set_title(f"CDF over functions, {title}", fontsize=10)
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of functions")
    axes[1].legend(
        fontsize=6,
        loc="upper left",
        bbox_to_anchor=(1.02, 1.0),
        title="placement x keep-alive",
        title_fontsize=7,
    )
    return save(figure, path)


def timeline(series: dict[str, dict[str, list[float]] | None], path: Path) -> Path:
    """Nodes, CPU allocation and power over the simulated time, one line per combination."""
    figure, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    for label, values in series.items():
        if not values:
            continue
        hours = [m / 60.0 for m in values["minute"]]
        axes[0].plot(hours, values["nodes"], label=label, linewidth=1)
        axes[1].plot(hours, [100 * v for v in values["cpu_allocation"]], linewidth=1)
        axes[2].plot(hours, [w / 1000 for w in values["watts"]], linewidth=1)
    for axis, title in zip(axes, ("nodes", "CPU allocated (%)", "power (kW)")):
        axis.set_ylabel(title)
        axis.grid(alpha=0.3)
    axes[2].set_xlabel("hour")
    axes[0].legend(fontsize=6, ncol=2)
    return save(figure, path)


def evaluation(result: dict[str, Any], path: Path) -> Path:
    """Per cluster, each policy's composite and objectives relative to kube-default on the same
    seed (paired), with 95 % intervals."""
    entries = result["results"]
    clusters = list(dict.fromkeys(e["cluster"] for e in entries))
    keys = (
        ("utilization", "CPU allocation"),
        ("qos_s", "weighted cold s"),
        ("cost_usd", "cost"),
        ("energy_j", "energy"),
    )
    figure, axes = plt.subplots(1, len(clusters), figsize=(5 * len(clusters), 4), squeeze=False)
    for axis, cluster in zip(axes[0], clusters):
        mine = [e for e in entries if e["cluster"] == cluster]
        width = 0.8 / len(mine)
        for i, entry in enumerate(mine):
            cells = [entry["composite"]] + [entry["relative_to"]["kube-default"][key] for key, _ in keys]
            positions = [k + i * width for k in range(len(cells))]
            axis.bar(
                positions,
                [c["mean"] for c in cells],
                width,
                yerr=[c["ci95"] for c in cells],
                label=entry["policy"],
                capsize=2,
            )
        axis.axhline(1.0, color="grey", linewidth=0.8)
        labels = ["composite", *(label for _, label in keys)]
        axis.set_xticks([k + 0.4 - width / 2 for k in range(len(labels))], labels, fontsize=8)
        axis.set_title(f"{cluster}: ratio to kube-default, paired", fontsize=10)
        axis.legend(fontsize=7)
    return save(figure, path)


def learning_curve(progress_csv: Path, path: Path) -> Path:
    """Episodic return over training, one colour per curriculum stage (returns grow with the
    cluster, so they compare within a stage, not across)."""
    with progress_csv.open() as handle:
        rows = list(csv.DictReader(handle))
    figure, axis = plt.subplots(figsize=(6.5, 3.5))
    for stage in dict.fromkeys(r["curriculum_stage"] for r in rows):
        mine = [r for r in rows if r["curriculum_stage"] == stage]
        axis.plot(
            [float(r["global_step"]) for r in mine],
            [float(r["episodic_return"]) for r in mine],
            label=f"clusters of up to {float(stage):.0f} nodes",
        )
    axis.set_xlabel("placements (environment steps)")
    axis.set_ylabel("episodic return (mean of last 20)")
    axis.set_title("PPO on the training split, by curriculum stage")
    axis.legend(fontsize=8)
    return save(figure, path)


def save(figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
