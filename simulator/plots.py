"""PNG plots of a report: the cold-start / wasted-memory Pareto and the cluster over time."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt


def write_all(report: dict[str, Any], out: Path) -> list[Path]:
    paths = [pareto(report["results"], out / "pareto.png")]
    if any(report["series"].values()):
        paths.append(timeline(report["series"], out / "timeline.png"))
    return paths


def pareto(results: list[dict[str, Any]], path: Path) -> Path:
    """75th-percentile cold-start % against wasted memory (fixed 10-minute keep-alive = 100)."""
    figure, axis = plt.subplots(figsize=(7, 5))
    for entry in results:
        x, label = entry.get("wasted_memory_norm"), _label(entry)
        for key, marker in (("cold_start_pct_p75", "o"), ("cold_start_pct_p75_weighted", "^")):
            if x is not None and entry.get(key) is not None:
                axis.scatter(x, entry[key], marker=marker)
        if x is not None and entry.get("cold_start_pct_p75") is not None:
            axis.annotate(
                label, (x, entry["cold_start_pct_p75"]), fontsize=7, xytext=(3, 3), textcoords="offset points"
            )
    axis.set_xlabel("wasted memory time (fixed 10-min keep-alive = 100)")
    axis.set_ylabel("75th-percentile cold-start % (o unweighted, ^ weighted)")
    axis.grid(alpha=0.3)
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


def _label(entry: dict[str, Any]) -> str:
    return f"{entry['placement']} / {entry['keepalive']}" if entry["placement"] else str(entry["keepalive"])


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
            cells = [entry["composite"]] + [entry["relative_to_reference"][key] for key, _ in keys]
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
        axis.set_title(f"{cluster}: relative to kube-default (paired by seed)")
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
