"""Placement policies judged on the objectives: `kdrl evaluate` and the heuristic's grid search.

Each case is one (cluster, seed) on a split of the trace; a policy's run gives `Objectives`,
and its composite is taken against `kube-default` on the same case (so kube-default scores 1,
lower is better). Across seeds, means come with 95 % confidence intervals (Student's t).
Tuning (`tune`) sees only the training split; evaluation only the evaluation split.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from policies import heuristics, onnx_policy, registry
from policies.objectives import SLA_VIOLATION_S, Objectives, ObjectiveWeights, composite
from policies.placement import PlacementPolicy
from simulator import clusterspec, engine, keepalive, report, traces, workload
from simulator.traces import EVAL_MINUTES, TRAIN_MINUTES

REFERENCE = "kube-default"
POLICIES = ("onnx", "tuned", "kube-default", "most-allocated", "random")
CLUSTERS = ("small", "medium", "large")
# Functions per bundled cluster: the slice's 338 saturate `small` (every request waits for a node).
DEFAULT_FUNCTIONS: Mapping[str, int] = {"small": 80, "medium": 338, "large": 338}
T_95 = {1: 12.71, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


@dataclass(frozen=True)
class Case:
    cluster: str
    seed: int
    functions: int | None
    minutes: tuple[int, int]
    population: str | None = None


def placement(name: str, *, seed: int, model: Path = onnx_policy.DEFAULT_MODEL) -> PlacementPolicy:
    """A policy by name: the heuristics, `tuned`, or `onnx` (the shipped model; kube-default
    with a loud log when it cannot load)."""
    return registry.load(name, seed=seed, model=model, device="cpu").policy


def case_trace(trace: traces.Trace, case: Case) -> traces.Trace:
    rows = np.arange(len(trace))
    if case.population:
        rows = rows[np.asarray(trace.populations) == case.population]
    if case.functions is not None and case.functions < rows.size:
        rows = np.sort(np.random.default_rng(case.seed).choice(rows, size=case.functions, replace=False))
    return trace.subset(rows).window(*case.minutes)


def run(trace: traces.Trace, case: Case, policy: PlacementPolicy) -> dict[str, Any]:
    """One simulation: the objectives and the report's headline fields."""
    window = case_trace(trace, case)
    simulation = engine.Simulation(
        workload=workload.build(window, seed=case.seed),
        counts=window.counts,
        cluster=clusterspec.load(case.cluster),
        placement=policy,
        keepalive=keepalive.by_name("knative"),
        seed=case.seed,
    )
    result = simulation.run()
    seconds = window.minutes * 60.0
    entry = report.cluster_entry(result, window.weights, seconds)
    objectives = objectives_of(result, seconds)
    return {
        "objectives": objectives,
        "cold_start_latency_p50_s": entry["cold_start_latency_p50_s"],
        "cold_start_latency_p99_s": entry["cold_start_latency_p99_s"],
        "sla_violation_pct": entry["sla_violation_pct"],
        "image_pulls": entry["image_pulls"],
        "timed_out_requests": entry["timed_out_requests"],
        "nodes_mean": entry["nodes_mean"],
    }


def objectives_of(result: engine.RunResult, seconds: float) -> Objectives:
    meters = result.meters
    return Objectives(
        utilization=meters.utilization_s / seconds if seconds else 0.0,
        qos_s=meters.weighted_cold_s + SLA_VIOLATION_S * meters.weighted_sla_violations,
        cost_usd=result.cost_usd,
        energy_j=result.energy_j,
    )


def _job(args: tuple[Path, Case, str, Path]) -> tuple[Case, str, dict[str, Any]]:
    trace_path, case, name, model = args
    trace = traces.load(trace_path)
    return case, name, run(trace, case, placement(name, seed=case.seed, model=model))


def evaluate(
    trace_path: Path,
    *,
    policies: Sequence[str] = POLICIES,
    clusters: Sequence[str] = CLUSTERS,
    seeds: Sequence[int] = (1, 2, 3, 4, 5),
    functions: int | None = None,
    population: str | None = None,
    minutes: tuple[int, int] = EVAL_MINUTES,
    model: Path = onnx_policy.DEFAULT_MODEL,
    weights: ObjectiveWeights | None = None,
    workers: int = 0,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Every policy on every (cluster, seed), summarised per cluster with 95 % intervals."""
    weights = weights or ObjectiveWeights()
    names = list(dict.fromkeys([*policies, REFERENCE]))
    cases = [
        Case(c, s, functions if functions is not None else DEFAULT_FUNCTIONS.get(c), minutes, population)
        for c in clusters
        for s in seeds
    ]
    jobs = [(trace_path, case, name, model) for case in cases for name in names]
    runs: dict[tuple[Case, str], dict[str, Any]] = {}
    with ProcessPoolExecutor(max_workers=min(workers or os.cpu_count() or 1, len(jobs))) as pool:
        for case, name, outcome in pool.map(_job, jobs):
            runs[case, name] = outcome
            progress(f"{case.cluster} seed {case.seed}: {name}")
    entries = []
    for cluster in clusters:
        for name in names:
            mine = [(case, runs[case, name]) for case in cases if case.cluster == cluster]
            entries.append(_summary(cluster, name, mine, runs, weights))
    return {
        "config": {
            "trace": trace_path.name,
            "minutes": list(minutes),
            "seeds": list(seeds),
            "functions": {
                c: (functions if functions is not None else DEFAULT_FUNCTIONS.get(c)) for c in clusters
            },
            "population": population or "all",
            "weights": {k: getattr(weights, k) for k in ("utilization", "qos", "cost", "other")},
            "reference": REFERENCE,
        },
        "results": entries,
    }


def _summary(
    cluster: str,
    name: str,
    mine: list[tuple[Case, dict[str, Any]]],
    runs: Mapping[tuple[Case, str], dict[str, Any]],
    weights: ObjectiveWeights,
) -> dict[str, Any]:
    composites = [
        composite(o["objectives"], runs[case, REFERENCE]["objectives"], weights) for case, o in mine
    ]
    fields = {
        "utilization": [o["objectives"].utilization for _, o in mine],
        "qos_weighted_cold_s": [o["objectives"].qos_s for _, o in mine],
        "cost_usd": [o["objectives"].cost_usd for _, o in mine],
        "energy_kwh": [o["objectives"].energy_j / 3.6e6 for _, o in mine],
        "cold_start_latency_p50_s": [o["cold_start_latency_p50_s"] or 0.0 for _, o in mine],
        "cold_start_latency_p99_s": [o["cold_start_latency_p99_s"] or 0.0 for _, o in mine],
        "sla_violation_pct_critical": [o["sla_violation_pct"]["critical"] for _, o in mine],
        "sla_violation_pct_high": [o["sla_violation_pct"]["high"] for _, o in mine],
        "image_pulls": [float(o["image_pulls"]) for _, o in mine],
        "timed_out_requests": [float(o["timed_out_requests"]) for _, o in mine],
        "nodes_mean": [o["nodes_mean"] for _, o in mine],
    }
    entry: dict[str, Any] = {"cluster": cluster, "policy": name, "seeds": len(mine)}
    entry["composite"] = interval(composites)
    for key, values in fields.items():
        entry[key] = interval(values)
    # Paired with kube-default on the same seed: seeds differ far more than policies do.
    reference = [runs[case, REFERENCE]["objectives"] for case, _ in mine]
    entry["relative_to_reference"] = {
        key: interval(
            _ratio(getattr(o["objectives"], key), getattr(r, key)) for (_, o), r in zip(mine, reference)
        )
        for key in ("utilization", "qos_s", "cost_usd", "energy_j")
    }
    return entry


def _ratio(value: float, reference: float) -> float:
    return value / reference if reference else 1.0


def interval(values: Iterable[float]) -> dict[str, float]:
    """Mean and 95 % confidence half-width (Student's t; 0 for a single value)."""
    data = np.asarray(list(values), dtype=np.float64)
    mean = float(data.mean()) if data.size else float("nan")
    if data.size < 2:
        return {"mean": round(mean, 6), "ci95": 0.0}
    half = T_95.get(data.size - 1, 1.96) * float(data.std(ddof=1)) / np.sqrt(data.size)
    return {"mean": round(mean, 6), "ci95": round(half, 6)}


# -- grid search of the weighted heuristic, on the training split only ----------------------------
TUNE_TERMS = ("MostAllocated", "ImageLocality", "Cheapness", "PowerEfficiency")
TUNE_GRID = (0.0, 1.0, 3.0)
TUNE_CASES = (
    Case("small", 11, 80, (TRAIN_MINUTES[0], TRAIN_MINUTES[0] + 240)),
    Case("medium", 12, 338, (TRAIN_MINUTES[1] - 240, TRAIN_MINUTES[1])),
)


def _tune_job(args: tuple[Path, Case, tuple[float, ...]]) -> tuple[Case, tuple[float, ...], Objectives]:
    trace_path, case, grid_weights = args
    trace = traces.load(trace_path)
    if not any(grid_weights):
        policy: PlacementPolicy = heuristics.kube_default()
    else:
        mix = {"BalancedAllocation": 1.0, **dict(zip(TUNE_TERMS, grid_weights))}
        policy = heuristics.weighted("tuned", mix)
    return case, grid_weights, run(trace, case, policy)["objectives"]


def tune(
    trace_path: Path,
    *,
    cases: Sequence[Case] = TUNE_CASES,
    grid: Sequence[float] = TUNE_GRID,
    weights: ObjectiveWeights | None = None,
    workers: int = 0,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Every weight combination on the training-split cases; the best mean composite wins."""
    weights = weights or ObjectiveWeights()
    for case in cases:
        if case.minutes[1] > TRAIN_MINUTES[1]:
            raise ValueError(f"tuning case {case} reaches beyond the training split")
    combos = [c for c in itertools.product(grid, repeat=len(TUNE_TERMS)) if any(c)]
    reference = tuple(0.0 for _ in TUNE_TERMS)  # the all-zero combination stands for kube-default
    jobs = [(trace_path, case, combo) for case in cases for combo in [reference, *combos]]
    measured: dict[tuple[Case, tuple[float, ...]], Objectives] = {}
    with ProcessPoolExecutor(max_workers=min(workers or os.cpu_count() or 1, len(jobs))) as pool:
        for case, combo, objectives in pool.map(_tune_job, jobs):
            measured[case, combo] = objectives
            progress(f"{case.cluster}: {combo}")
    scores = {
        combo: float(np.mean([composite(measured[c, combo], measured[c, reference], weights) for c in cases]))
        for combo in combos
    }
    best = min(scores, key=lambda combo: (scores[combo], combo))
    return {
        "weights": {"BalancedAllocation": 1.0, **dict(zip(TUNE_TERMS, best))},
        "composite_vs_kube_default": round(scores[best], 6),
        "grid": list(grid),
        "cases": [
            {"cluster": c.cluster, "seed": c.seed, "functions": c.functions, "minutes": list(c.minutes)}
            for c in cases
        ],
        "ranking": [
            {"weights": dict(zip(TUNE_TERMS, combo)), "composite": round(score, 6)}
            for combo, score in sorted(scores.items(), key=lambda item: item[1])[:10]
        ],
    }
