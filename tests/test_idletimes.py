"""The idle-time answer: each function's hazard, shrunk towards the pool of every function's."""

from __future__ import annotations

import numpy as np
import pytest

from forecaster import idletimes
from forecaster.forecasting import Forecast
from forecaster.idletimes import Pattern

NO_PRIOR = np.zeros(idletimes.BINS)


def answer(
    gaps: list[float], elapsed: int, horizon: int, prior: np.ndarray = NO_PRIOR, strength: float = 1.0
):  # type: ignore[no-untyped-def]
    own = idletimes.counts(np.asarray(gaps, dtype=np.float64))
    return idletimes.within_after(own, np.array([elapsed]), horizon, prior, strength)[0]


def test_a_periodic_function_is_certain_only_when_its_period_comes() -> None:
    gaps = [30.0] * 20  # invoked every 30 minutes
    assert answer(gaps, elapsed=10, horizon=5).max() == 0.0
    due = answer(gaps, elapsed=28, horizon=5)
    # 28 minutes idle: the next invocation ends a 30-minute period, the third minute from now;
    # one pseudo-period (strength 1) from an empty pool keeps it short of certainty.
    assert due[:2].tolist() == [0.0, 0.0] and due[2] == pytest.approx(20 / 21)
    assert np.all(np.diff(due) >= 0)


def test_only_periods_at_least_as_long_as_the_current_one_count() -> None:
    gaps = [1.0, 1.0, 1.0, 5.0, 5.0, 9.0]
    # Periods >= 4: 5, 5, 9 (+ one pseudo-period): 2 of 4 end at 5 (k = 2); then 1 of 2 at 9 (k = 6).
    assert answer(gaps, elapsed=4, horizon=6).tolist() == pytest.approx([0.0, 0.5, 0.5, 0.5, 0.5, 0.75])


def test_a_new_function_takes_the_pool_and_its_own_periods_take_over() -> None:
    pool = idletimes.counts(np.array([1.0] * 50 + [10.0] * 50))  # everyone: 1 or 10 minutes
    prior = idletimes.pooled_hazard(pool)
    assert prior[1] == pytest.approx(0.5) and prior[10] == pytest.approx(1.0)
    new = answer([], elapsed=1, horizon=1, prior=prior, strength=2.0)
    assert new[0] == pytest.approx(0.5)  # nothing of its own: the pool's hazard
    own = answer([3.0] * 40, elapsed=1, horizon=3, prior=prior, strength=2.0)
    # 40 periods of its own that never end at 1 minute outweigh two pseudo-periods that do.
    assert own[0] == pytest.approx(1 / 42) and own[2] > 0.95


def test_idle_times_beyond_the_range_know_no_timing() -> None:
    prior = np.full(idletimes.BINS, 0.01)
    far = answer([500.0] * 10, elapsed=600, horizon=2, prior=prior, strength=2.0)
    assert far.tolist() == pytest.approx([2 * 0.01 / 12, 1 - (1 - 2 * 0.01 / 12) ** 2])


def series_gaps(minutes: list[int]) -> np.ndarray:
    return idletimes.counts(np.diff(np.asarray(minutes)).astype(np.float64))


@pytest.mark.parametrize(
    ("minutes", "expected"),
    [
        ([0, 5, 9], Pattern.NEW),
        (list(range(100)), Pattern.ALWAYS_WARM),
        ([*range(0, 600, 30), 601], Pattern.PERIODIC),
        ([0, 1, 2, 60, 61, 62, 150, 151, 152, 300, 301], Pattern.BURSTY),
        ([0, 7, 50, 53, 140, 200, 231, 400], Pattern.SPARSE),
    ],
)
def test_patterns_from_synthetic_series(minutes: list[int], expected: Pattern) -> None:
    assert idletimes.patterns(series_gaps(minutes)) == [expected]


def test_a_forecast_moved_on_drops_minutes_and_takes_the_new_idle_answer() -> None:
    forecast = Forecast(
        function="ns/fn",
        start_minute=100,
        expected=np.array([0.1, 0.2, 0.3, 0.4]),
        p_invoked=np.array([0.1, 0.2, 0.5, 0.5]),
        p_within=np.array([0.1, 0.28, 0.64, 0.82]),
        prewarm_minutes=0.0,
        keepalive_minutes=10.0,
        model="TSB",
        relative_mae=None,
    )
    later = forecast.later(2, p_within_idle=np.array([0.9, 1.0]))
    assert later.start_minute == 102 and later.expected.tolist() == [0.3, 0.4]
    assert np.allclose(later.p_within, [0.5, 0.75])  # 1 - (1 - 0.5)(1 - 0.5)
    assert later.best_p_within.tolist() == [0.9, 1.0]
    assert forecast.best_p_within is forecast.p_within  # no idle answer: the model's
