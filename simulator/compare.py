"""Run placement x keep-alive combinations on one workload and gather the report.

Runs are independent (each seeded from the run seed alone), so they go to worker processes
and the report is identical however many there are.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from policies import registry
from simulator import clusterspec, engine, keepalive, prewarming, report, study, traces, workload

BUNDLED_TRACE = Path(__file__).resolve().parent / "data" / "azure2019_slice"
# The default comparison: upstream's default, the tuned heuristic and the shipped learned model
# (`most-allocated` and `random` on request).
PLACEMENTS = ("kube-default", "tuned", "onnx")
KEEPALIVES = ("knative", "fixed:10", "hybrid", "prewarm", "prewarm:nopull")
MODES = ("cluster", "keepalive")


# The flag of `kdrl simulate` and the prewarm benches for `Options.drain_underused`.
DRAIN_UNDERUSED_HELP = (
    "cluster mode: the cluster autoscaler also drains nodes under half allocated, as the real one "
    "does and `kdrl evaluate` assumes (off: only empty nodes go, docs/prewarm.md's ground)"
)


@dataclass(frozen=True)
class Options:
    trace: Path = BUNDLED_TRACE
    population: str | None = None  # heavy | light | None for both
    functions: int | None = None  # a seeded selection of this many; None: all
    weighted: bool = False  # draw the selection by occ_ref_samples
    hours: float = 24.0
    cluster: str = "medium"
    mode: str = "cluster"
    placements: tuple[str, ...] = PLACEMENTS
    keepalives: tuple[str, ...] = KEEPALIVES
    seed: int = 1
    workers: int = 0  # 0: one per CPU
    # Cluster mode: minutes run but not counted. A run starts with every revision at zero and
    # every image cache empty at once; the burst of cold starts and pulls in its first minute
    # (58 % of a planned day's cold requests, bench.prewarm seed 1) is no running cluster's.
    warmup_minutes: int = 10
    # Cluster mode: the cluster autoscaler also drains nodes under half allocated, as the real
    # one does (the placement protocol's ground, `evaluation.DRAIN_UNDERUSED`). Off by default:
    # docs/prewarm.md's tables were measured with only empty nodes released.
    drain_underused: bool = False

    def validate(self) -> None:
        """Fail before any work: unknown names, absurd numbers."""
        if self.mode not in MODES:
            raise ValueError(f"--mode {self.mode!r}: expected cluster or keepalive")
        if self.population not in (None, *traces.POPULATIONS):
            raise ValueError(f"--population {self.population!r}: expected heavy or light")
        if not 0 < self.hours <= 24:
            raise ValueError(f"--hours {self.hours}: expected 0 < hours <= 24 (one trace day)")
        if self.warmup_minutes < 0 or (self.mode == "cluster" and self.warmup_minutes >= self.hours * 60):
            raise ValueError(f"--warmup-minutes {self.warmup_minutes}: expected 0 <= minutes < the run's")
        if self.functions is not None and self.functions <= 0:
            raise ValueError(f"--functions {self.functions}: expected a positive number")
        for name in self.placements:
            registry.check(name)
        for name in self.keepalives:
            keepalive.by_name(name)


def select(trace: traces.Trace, options: Options) -> traces.Trace:
    """The functions and hours the options ask for."""
    rows = np.arange(len(trace))
    if options.population:
        rows = rows[np.asarray(trace.populations)[rows] == options.population]
    if options.functions is not None and options.functions < rows.size:
        rng = np.random.default_rng(options.seed)
        weights = trace.weights[rows] if options.weighted else np.ones(rows.size)
        eligible = rows[weights > 0]
        count = min(options.functions, eligible.size)
        p = weights[weights > 0] / weights[weights > 0].sum()
        rows = np.sort(rng.choice(eligible, size=count, replace=False, p=p))
    elif options.weighted:
        rows = rows[trace.weights[rows] > 0]
    return trace.subset(rows).window(0, int(round(options.hours * 60)))


def compare(options: Options, *, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """The report: one entry per combination, plus series for the plots and decision timings."""
    options.validate()
    trace = select(traces.load(options.trace), options)
    all_jobs = jobs(options)
    workers = min(options.workers or os.cpu_count() or 1, len(all_jobs))
    runner = _run_study if options.mode == "keepalive" else _run_cluster
    planned = [job for job in all_jobs if _planned(job[1])]
    results: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max_workers=workers) as pool:
        # Forecasting the trace is one job whose result every planner run shares; the others
        # run meanwhile.
        schedule = None
        specs = workload.build(trace, seed=options.seed).functions
        if planned:
            services = [spec.service for spec in specs]
            schedule = pool.submit(prewarming.forecast_schedule, trace.counts, services)
        futures = {job: pool.submit(runner, trace, job, options) for job in all_jobs if job not in planned}
        if schedule is not None:
            forecasts = schedule.result()
            planner_run = partial(_run_cluster, forecasts=forecasts)  # planned runs are cluster runs
            futures.update({job: pool.submit(planner_run, trace, job, options) for job in planned})
        for job in all_jobs:
            entry = futures[job].result()
            results.append(entry)
            progress(f"{entry['placement'] or '-'} x {entry['keepalive']}")
    report.normalise_wasted(results)
    timings = {f"{r['placement']} x {r['keepalive']}": r.pop("decision_time_us", None) for r in results}
    series = {f"{r['placement']} x {r['keepalive']}": r.pop("series", None) for r in results}
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(options).items() if k != "workers"}
    config["trace"] = options.trace.name
    counted_from = _counted_from(options)
    invocations = trace.counts[:, counted_from:].sum(axis=1)
    # No policy has history of a function before its first call, so that call is cold under every
    # one: a one-day trace's floor that a service running for days would not have.
    first_call_counted = (trace.counts[:, :counted_from].sum(axis=1) == 0) & (invocations > 0)
    per_function = {
        "func_ids": list(trace.func_ids),
        "populations": list(trace.populations),
        "priorities": [spec.priority.value for spec in specs],
        "invocations": invocations.tolist(),
        "first_call_counted": first_call_counted.tolist(),
        "weights": trace.weights.tolist(),
        "memory_mb": [spec.memory_bytes >> 20 for spec in specs],
        "gpus": [spec.gpu for spec in specs],
        "cold_starts": {
            f"{r['placement']} x {r['keepalive']}": r.pop("cold_starts_per_function") for r in results
        },
    }
    return {
        "config": config,
        "functions": len(trace),
        "results": results,
        "per_function": per_function,
        "series": series,
        "timings": timings,
    }


def _counted_from(options: Options) -> int:
    return options.warmup_minutes if options.mode == "cluster" else 0


def jobs(options: Options) -> list[tuple[str | None, str]]:
    """The (placement, keep-alive) runs the options ask for, with the fixed:10 reference."""
    keepalives = list(options.keepalives)
    if "fixed:10" not in keepalives:
        keepalives.append("fixed:10")  # the normalisation reference for wasted memory
    if options.mode == "keepalive":  # the planner needs a cluster
        return [(None, k) for k in keepalives if not _planned(k)]
    return [(p, k) for p in options.placements for k in keepalives]


def _planned(keepalive_name: str) -> bool:
    return isinstance(keepalive.by_name(keepalive_name), keepalive.PlannedPrewarm)


def _run_study(trace: traces.Trace, job: tuple[str | None, str], options: Options) -> dict[str, Any]:
    _, keepalive_name = job
    outcome = study.run(study.IdlePeriods.from_counts(trace.counts), keepalive.by_name(keepalive_name))
    entry = _head(job, options)
    entry.update(report.study_entry(outcome, trace.memory_mb[:, 3], trace.weights))
    entry["cold_starts_per_function"] = outcome.cold_starts.tolist()
    entry["populations"] = {
        population: report.study_entry(_only(outcome, rows), trace.memory_mb[rows, 3], trace.weights[rows])
        for population, rows in _population_rows(trace)
    }
    return entry


def _run_cluster(
    trace: traces.Trace,
    job: tuple[str | None, str],
    options: Options,
    forecasts: prewarming.ForecastSchedule | None = None,
) -> dict[str, Any]:
    placement_name, keepalive_name = job
    assert placement_name is not None
    functions = workload.build(trace, seed=options.seed)
    cluster = clusterspec.load(options.cluster)
    placement = registry.load(placement_name, seed=options.seed, device="cpu").policy
    policy = keepalive.by_name(keepalive_name)
    prewarmer = None
    if isinstance(policy, keepalive.PlannedPrewarm):
        assert forecasts is not None
        prewarmer = prewarming.SimulatedPrewarm(
            schedule=forecasts,
            states=prewarming.function_states(functions),
            policy=placement,
            budget=prewarming.budget(cluster),
            pull=policy.pull,
            settings=prewarming.planner_settings(options.drain_underused),
        )
    simulation = engine.Simulation(
        workload=functions,
        counts=trace.counts,
        cluster=cluster,
        placement=placement,
        keepalive=policy,
        seed=options.seed,
        prewarmer=prewarmer,
        warmup_minutes=options.warmup_minutes,
        drain_underused=options.drain_underused,
    )
    result = simulation.run()
    entry = _head(job, options)
    entry.update(report.cluster_entry(result, trace.weights, (trace.minutes - options.warmup_minutes) * 60.0))
    entry["cold_starts_per_function"] = result.cold_starts.tolist()
    entry["populations"] = {
        population: report.cold_start_summary(
            result.invocations[rows], result.cold_starts[rows], trace.weights[rows]
        )
        for population, rows in _population_rows(trace)
    }
    decisions = np.asarray(result.decision_us)
    entry["decision_time_us"] = {
        "decisions": int(decisions.size),
        "p50": float(np.percentile(decisions, 50)) if decisions.size else None,
        "p99": float(np.percentile(decisions, 99)) if decisions.size else None,
    }
    entry["series"] = {name: values[::10] for name, values in result.series.items()}  # every 10 minutes
    return entry


def _head(job: tuple[str | None, str], options: Options) -> dict[str, Any]:
    placement_name, keepalive_name = job
    return {
        "placement": placement_name,
        "keepalive": keepalive_name,
        "population": options.population or "all",
        "mode": options.mode,
    }


def _population_rows(trace: traces.Trace) -> Sequence[tuple[str, np.ndarray]]:
    populations = np.asarray(trace.populations)
    return [(p, np.flatnonzero(populations == p)) for p in traces.POPULATIONS if (populations == p).any()]


def _only(outcome: study.Outcome, rows: np.ndarray) -> study.Outcome:
    return study.Outcome(
        invocations=outcome.invocations[rows],
        cold_starts=outcome.cold_starts[rows],
        wasted_minutes=outcome.wasted_minutes[rows],
    )
