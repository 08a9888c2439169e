"""The idle-time answer: each function's hazard, shrunk towards the pool of every function's."""

from __future__ import annotations

import numpy as np
import pytest

from forecaster import idletimes
from forecaster.forecasting import Forecast, idle_answers
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
    # The 10-minute periods all end in their first minute from 10 on: a tail rate of 1, two
    # pseudo-periods of it beside the 100 periods at risk at 1 minute.
    assert prior[1] == pytest.approx(52 / 102) and prior[10] == pytest.approx(1.0)
    new = answer([], elapsed=1, horizon=1, prior=prior, strength=2.0)
    assert new[0] == pytest.approx(prior[1])  # nothing of its own: the pool's hazard
    own = answer([3.0] * 40, elapsed=1, horizon=3, prior=prior, strength=2.0)
    # 40 periods of its own that never end at 1 minute outweigh two pseudo-periods that do.
    assert own[0] == pytest.approx(2 * prior[1] / 42) and own[2] > 0.95


def test_where_no_period_lasted_that_long_the_pool_speaks_with_its_tail_rate() -> None:
    # 30 periods of 20 minutes spend 11 minutes each from minute 10 on, 10 of 40 spend 31:
    # 40 ended in 640 minutes.
    pool = idletimes.counts(np.array([2.0] * 100 + [20.0] * 30 + [40.0] * 10))
    assert idletimes.tail_rate(pool) == pytest.approx(40 / 640)
    prior = idletimes.pooled_hazard(pool)
    # Where none is at risk, the tail's rate (it was 0: "never"); where many are, their own share.
    assert prior[100] == pytest.approx(40 / 640)
    assert prior[2] == pytest.approx((100 + 2 * 40 / 640) / 142)
    assert prior[30] == pytest.approx((2 * 40 / 640) / (10 + 2))  # 10 at risk, none ended
    # A function idle an hour, longer than any period of its own or the pool's, may yet be called.
    late = answer([5.0] * 3, elapsed=60, horizon=3, prior=prior, strength=2.0)
    assert late[2] == pytest.approx(1 - (1 - 40 / 640) ** 3)


def test_periods_still_running_are_at_risk_and_spend_idle_minutes() -> None:
    pool = idletimes.counts(np.array([20.0] * 30))  # 30 ended at 20 minutes: 11 minutes each from 10
    running = idletimes.counts(np.array([101.0] * 10))  # 10 idle for 100 minutes so far: 91 each
    assert idletimes.tail_rate(pool, running) == pytest.approx(30 / (330 + 910))
    prior = idletimes.pooled_hazard(pool, running)
    rate = 30 / 1240
    # At 20 the ten still running were at risk too; at 50 only they are, and none has ended.
    assert prior[20] == pytest.approx((30 + 2 * rate) / (40 + 2))
    assert prior[50] == pytest.approx(2 * rate / (10 + 2))
    assert prior[150] == pytest.approx(rate)  # beyond every period, ended or running


def test_a_function_long_idle_lowers_what_the_pool_expects_of_others() -> None:
    every_five = np.zeros(100, dtype=np.int64)
    every_five[::5] = 1  # 19 periods of 5 minutes; its last call at 95
    new = np.zeros(100, dtype=np.int64)
    new[98] = 1  # one call, two minutes ago: the pool speaks for it
    quiet = np.zeros(100, dtype=np.int64)
    quiet[0] = 1  # idle ever since: at risk at every length below 100, ended at none

    def new_answer(histories: dict[str, np.ndarray]) -> float:
        gaps = {f: np.diff(np.flatnonzero(series)).astype(np.float64) for f, series in histories.items()}
        within = idle_answers(histories, gaps, horizon=4)["new"][0]
        assert within is not None
        return float(within[-1])  # periods of 2 to 5 minutes: only 5 ever ended

    alone = new_answer({"every_five": every_five, "new": new})
    beside_quiet = new_answer({"every_five": every_five, "new": new, "quiet": quiet})
    assert alone == pytest.approx(19 / 21) and beside_quiet == pytest.approx(19 / 22)


def test_before_any_long_period_has_ended_the_pool_knows_no_tail() -> None:
    pool = idletimes.counts(np.array([1.0] * 30 + [4.0] * 5))  # the first minutes of a run
    assert idletimes.tail_rate(pool) == 0.0
    prior = idletimes.pooled_hazard(pool)
    assert prior[9:].max() == 0.0 and prior[1] == pytest.approx(30 / 37)


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
