"""Ground checks: the reference configuration serves its load on every bundled cluster, and a
simulated cold start is made of parts in their published ranges (docs/simulator-fidelity.md)."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import compare, engine, fidelity, knative, nodes, traces, workload
from tests.test_engine import one_function, simulate

SEEDS = range(1, 11)


@pytest.fixture(scope="module")
def reference_rows() -> list[dict[str, object]]:
    return fidelity.reference_runs(compare.BUNDLED_TRACE, ("small", "medium", "large"), SEEDS, workers=2)


def test_kube_default_with_knative_times_out_at_most_a_thousandth_of_requests(
    reference_rows: list[dict[str, object]],
) -> None:
    assert len(reference_rows) == 30
    for row in reference_rows:
        assert row["invocations"] > 0 and row["cold_starts"] > 0  # the check measures something
        assert row["timed_out_share"] <= fidelity.MAX_TIMEOUT_SHARE, row
        # The median cold request is a start-up, not a wait for the request timeout.
        assert row["cold_start_latency_p50_s"] < 10.0, row


def test_most_cases_draw_gpu_functions(
    reference_rows: list[dict[str, object]],
) -> None:
    gpu = [row["gpu_functions"] for row in reference_rows]
    assert sum(1 for g in gpu if g) >= 20  # GPU placement is exercised on most cases


@pytest.mark.parametrize("part", fidelity.COLD_START_PARTS, ids=lambda p: p.name.split(" (")[0])
def test_each_cold_start_part_sits_in_its_published_range(part: fidelity.Part) -> None:
    low, high = part.published_s
    assert low <= part.simulated_s[0] <= part.simulated_s[1] <= high, part
    assert part.source


def test_knative_autoscaler_and_kubernetes_defaults() -> None:
    config = knative.AutoscalerConfig()
    assert (config.stable_window_s, config.panic_window_percentage, config.panic_threshold) == (60, 10.0, 2.0)
    assert (config.scale_to_zero_grace_s, config.max_scale_down_rate, config.target_utilization) == (
        30.0,
        2.0,
        0.7,
    )
    assert config.tick_s == 2 and config.panic_window_s == 6
    assert engine.REQUEST_TIMEOUT_S == 300.0  # revision-timeout-seconds
    assert workload.KNATIVE_DEFAULT_TARGET == 100.0  # container-concurrency-target-default
    assert nodes.SCALE_DOWN_UNNEEDED_S == 600.0  # cluster-autoscaler scale-down-unneeded-time
    assert (nodes.IMAGE_GC_HIGH, nodes.IMAGE_GC_LOW) == (0.85, 0.80)  # kubelet image GC thresholds


def test_gpu_functions_are_batched_capped_and_only_those_a_gpu_pool_can_serve() -> None:
    trace = traces.load(compare.BUNDLED_TRACE)
    built = workload.build(trace, seed=1)
    peak = workload.peak_concurrency(trace.counts, built.duration_ms)
    limit = workload.GPU_MAX_SCALE * workload.GPU_TARGET * workload.TARGET_UTILIZATION
    gpu = np.array([f.gpu for f in built.functions], dtype=bool)
    assert gpu.any() and (peak > limit).any()  # both kinds are there to tell apart
    assert (peak[gpu] <= limit).all()
    for spec in built.functions:
        if spec.gpu:
            assert spec.max_scale == workload.GPU_MAX_SCALE and spec.concurrency_target == workload.GPU_TARGET
            assert spec.image_bytes >= workload.GPU_IMAGE_MIN_MIB * fidelity.MiB
        else:
            assert spec.max_scale == 0 and spec.concurrency_target == workload.KNATIVE_DEFAULT_TARGET


def test_max_scale_caps_the_pods_a_burst_asks_for() -> None:
    burst = {minute: 6000 for minute in range(3)}  # ~10 in flight at 0.1 s: many pods at target 1
    capped = simulate(burst, workload=one_function(concurrency_target=1.0, max_scale=3))
    free = simulate(burst, workload=one_function(concurrency_target=1.0))
    assert capped.pods_started <= 3 < free.pods_started
