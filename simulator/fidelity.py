"""Ground checks: is the simulated cluster one an operator would run, and are its cold starts
made of parts in the ranges published for Knative on Kubernetes?

`reference_runs` plays the reference configuration (kube-default placement, Knative's own
keep-alive) on the evaluation split of each cluster and seed, as `kdrl evaluate` does;
`COLD_START_PARTS` holds each part of a simulated cold start beside its published range and
source. tests/test_fidelity.py asserts both; docs/simulator-fidelity.md reports them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from policies import heuristics
from simulator import clusterspec, engine, evaluation, nodes, report, traces, workload

MiB = 1 << 20
# The reference configuration must serve its load: at most this share of requests may time out.
MAX_TIMEOUT_SHARE = 0.001


@dataclass(frozen=True, slots=True)
class Part:
    """One part of a cold start: the simulator's value(s), the published range, the source."""

    name: str
    simulated_s: tuple[float, float]  # (lowest, highest) the simulator can give
    published_s: tuple[float, float]
    source: str


def _pull_range_s() -> tuple[float, float]:
    """Pull time of the median function image over the slowest and fastest bundled pool."""
    bandwidths = [
        pool.pull_bytes_per_s
        for name in ("small", "medium", "large")
        for pool in clusterspec.load(name).pools
    ]
    image = workload.IMAGE_MEDIAN_MIB * MiB
    return image / max(bandwidths), image / min(bandwidths)


_STARTUP = engine.StartupConfig()
COLD_START_PARTS = (
    Part(
        "scheduling (scheduler cycle with the extender, bind)",
        (_STARTUP.scheduling_s, _STARTUP.scheduling_s),
        (0.001, 1.0),
        "kube-scheduler: >= 680 pods/s in process at 5,000 nodes (scheduler_perf), 111 pods/s through an "
        "HTTP extender at 500 nodes (kube-scheduler-wasm-extension #63); Huawei (EuroSys 2025): scheduling "
        "is a large part only where cold starts reach 7 s",
    ),
    Part(
        "image pull (median function image, per pool bandwidth)",
        _pull_range_s(),
        (1.0, 60.0),
        "knative/serving#283: '30 s pulls are not atypical'; nerdctl's stargz example: a 321 MB image at "
        "7.7 MiB/s takes 51.8 s; Slacker (FAST'16): pulls are 76 % of container start",
    ),
    Part(
        "container start (sandbox, container)",
        (_STARTUP.container_start_s, _STARTUP.container_start_s),
        (0.3, 2.0),
        "knative/serving#2484: ~2 s pod start-up with a cached image, container and queue-proxy "
        "readiness together; sig-scalability's pod start-up SLO (without pulls) is p99 <= 5 s",
    ),
    Part(
        "runtime init (language runtime, queue-proxy readiness)",
        (_STARTUP.runtime_init_s, _STARTUP.runtime_init_s),
        (0.1, 5.0),
        "Huawei (EuroSys 2025): code and dependency deployment 0.1 s to several seconds by runtime",
    ),
    Part(
        "cached cold start in all (scheduling + start + init)",
        (
            _STARTUP.scheduling_s + _STARTUP.container_start_s + _STARTUP.runtime_init_s,
            _STARTUP.scheduling_s + _STARTUP.container_start_s + _STARTUP.runtime_init_s,
        ),
        (0.8, 7.0),
        "knative/serving#15477: ~0.8 s activator cold start of a small function; kperf and Knative issues: "
        "2-4 s from zero with a cached image; Huawei (EuroSys 2025): medians 0.1-2 s by region, tails to 7 s",
    ),
    Part(
        "waiting for capacity (a new node joins)",
        (nodes.PROVISIONING_S, nodes.PROVISIONING_S),
        (30.0, 300.0),
        "cluster-autoscaler and Karpenter: a cloud VM joins in about one to a few minutes",
    ),
)


def reference_run(trace_path: Path, cluster: str, seed: int) -> dict[str, Any]:
    """kube-default x knative on the evaluation split of `cluster`, seed `seed`."""
    case = evaluation.Case(cluster, seed, evaluation.DEFAULT_FUNCTIONS.get(cluster), traces.EVAL_MINUTES)
    window = evaluation.case_trace(traces.load(trace_path), case)
    functions = workload.build(window, seed=seed)
    result = evaluation.simulate(window, cluster, seed, heuristics.kube_default())
    entry = report.cluster_entry(result, window.weights, window.minutes * 60.0)
    invocations = int(result.invocations.sum())
    return {
        "cluster": cluster,
        "seed": seed,
        "functions": len(window),
        "gpu_functions": sum(1 for f in functions.functions if f.gpu),
        "invocations": invocations,
        "cold_starts": entry["cold_starts"],
        "timed_out_requests": entry["timed_out_requests"],
        "timed_out_share": entry["timed_out_requests"] / invocations if invocations else 0.0,
        "cold_start_latency_p50_s": entry["cold_start_latency_p50_s"],
        "cold_start_latency_p99_s": entry["cold_start_latency_p99_s"],
        "capacity_wait_p50_s": entry["capacity_wait_p50_s"],
        "capacity_wait_p99_s": entry["capacity_wait_p99_s"],
        "image_pulls": entry["image_pulls"],
        "nodes_mean": entry["nodes_mean"],
    }


def _reference_job(args: tuple[Path, str, int]) -> dict[str, Any]:
    return reference_run(*args)


def reference_runs(
    trace_path: Path, clusters: Sequence[str], seeds: Sequence[int], *, workers: int = 0
) -> list[dict[str, Any]]:
    jobs = [(trace_path, cluster, seed) for cluster in clusters for seed in seeds]
    with ProcessPoolExecutor(max_workers=min(workers or os.cpu_count() or 1, len(jobs))) as pool:
        return list(pool.map(_reference_job, jobs))


def summary(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per cluster: the worst timed-out share over its seeds and the spread of cold-start parts."""
    out = []
    for cluster in dict.fromkeys(r["cluster"] for r in rows):
        mine = [r for r in rows if r["cluster"] == cluster]
        out.append(
            {
                "cluster": cluster,
                "seeds": len(mine),
                "worst_timed_out_share": max(r["timed_out_share"] for r in mine),
                "timed_out_requests": sum(r["timed_out_requests"] for r in mine),
                "invocations": sum(r["invocations"] for r in mine),
                "cold_start_latency_p50_s": float(
                    np.median([r["cold_start_latency_p50_s"] or 0 for r in mine])
                ),
                "cold_start_latency_p99_s_max": max(r["cold_start_latency_p99_s"] or 0 for r in mine),
                "capacity_wait_p99_s_max": max(r["capacity_wait_p99_s"] or 0 for r in mine),
                "gpu_functions": [r["gpu_functions"] for r in mine],
            }
        )
    return out
