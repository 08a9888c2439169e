"""The hybrid histogram policy on hand-made idle-time sequences (one implementation, two views)."""

from __future__ import annotations

import numpy as np
import pytest

from forecaster.histogram import HistogramParams, HybridHistogram, batch_windows


def windows_after(idle_times: list[float]) -> tuple[float, float]:
    histogram = HybridHistogram()
    for idle in idle_times:
        histogram.observe(idle)
    w = histogram.windows()
    return w.prewarm_minutes, w.keepalive_minutes


def test_no_history_keeps_alive_for_the_whole_range() -> None:
    assert windows_after([]) == (0.0, 240.0)


def test_representative_histogram_uses_head_and_tail_with_margins() -> None:
    # 95 idle times of 10 minutes, 5 of 30: head (5th pct) bin 10, tail (99th) bin 30.
    prewarm, keepalive = windows_after([10] * 95 + [30] * 5)
    assert prewarm == pytest.approx(10 * 0.9)
    assert keepalive == pytest.approx((30 + 1) * 1.1)


def test_spread_out_histogram_is_not_representative() -> None:
    # One idle time in each of 120 bins: CV of bin counts ~1 < 2, so the standard keep-alive.
    assert windows_after([float(m) for m in range(120)]) == (0.0, 240.0)


def test_mostly_out_of_range_idle_times_use_the_time_series_forecast() -> None:
    # Constant 6-hour idle times: AR(1) degenerates to their mean, 360 minutes.
    prewarm, keepalive = windows_after([360.0] * 4)
    assert prewarm == pytest.approx(360 * 0.85)
    assert keepalive == pytest.approx(360 * 0.15 * 2)


def test_forecast_is_an_ar1_least_squares_fit() -> None:
    idle = [400.0, 300.0, 380.0, 320.0, 360.0, 330.0]
    slope, intercept = np.polyfit(idle[:-1], idle[1:], 1)  # x_t = c + phi x_{t-1}
    expected = intercept + slope * idle[-1]
    prewarm, keepalive = windows_after(idle)
    assert prewarm == pytest.approx(expected * 0.85)
    assert keepalive == pytest.approx(expected * 0.3)
    assert expected != pytest.approx(np.mean(idle))


def test_unit_root_falls_back_to_the_mean() -> None:
    prewarm, _ = windows_after([300.0, 400.0, 500.0, 600.0])  # phi = 1: not a stationary AR(1)
    assert prewarm == pytest.approx(450 * 0.85)


def test_batch_equals_the_per_function_view() -> None:
    rng = np.random.default_rng(3)
    sequences = [list(rng.integers(1, 30, size=n).astype(float)) for n in (0, 1, 7, 40)] + [
        [400.0, 500.0, 2.0]
    ]
    gaps = np.array([g for s in sequences for g in s])
    offsets = np.cumsum([0] + [len(s) for s in sequences])
    prewarm, keepalive = batch_windows(gaps, offsets)
    position = 0
    for sequence in sequences:
        for i in range(len(sequence)):
            assert (prewarm[position], keepalive[position]) == pytest.approx(windows_after(sequence[:i]))
            position += 1


def test_parameters_are_the_published_ones() -> None:
    p = HistogramParams()
    assert (p.range_minutes, p.bin_minutes, p.head, p.tail, p.margin, p.cv_threshold) == (
        240,
        1,
        0.05,
        0.99,
        0.1,
        2,
    )
    assert p.bins == 240
