"""The idle-time answer: a function's own idle periods, and the hybrid verdict where they are few."""

from __future__ import annotations

import numpy as np

from forecaster import idletimes
from forecaster.forecasting import Forecast

NEVER = (0.0, 0.0)  # hybrid windows that never reach the future


def test_a_periodic_function_is_certain_only_when_its_period_comes() -> None:
    gaps = np.full(20, 30.0)  # invoked every 30 minutes
    early = idletimes.within_after(gaps, elapsed=10, horizon=5, windows=NEVER)
    due = idletimes.within_after(gaps, elapsed=28, horizon=5, windows=NEVER)
    assert early.max() == 0.0
    # 28 minutes idle: the next invocation ends a 30-minute period, the third minute from now.
    assert due[:2].tolist() == [0.0, 0.0] and due[2] == 20 / 21 and np.all(np.diff(due) >= 0)


def test_only_periods_at_least_as_long_as_the_current_one_count() -> None:
    gaps = np.array([1.0, 1.0, 1.0, 5.0, 5.0, 9.0])
    answer = idletimes.within_after(gaps, elapsed=4, horizon=6, windows=NEVER)
    # Periods >= 4: 5, 5, 9 (+ one that never ends): 2 of 4 end at 5 (k = 2), 3 of 4 by 9 (k = 6).
    assert answer.tolist() == [0.0, 0.5, 0.5, 0.5, 0.5, 0.75]


def test_little_data_or_an_unseen_idle_time_gives_the_hybrid_verdict() -> None:
    windows = (10.0, 5.0)  # warm from 10 to 15 minutes after the last invocation
    few = idletimes.within_after(np.array([3.0, 3.0]), elapsed=8, horizon=5, windows=windows)
    assert few.tolist() == [0.0, 0.0, 1.0, 1.0, 1.0]  # the window opens in the third minute
    unseen = idletimes.within_after(np.full(10, 3.0), elapsed=16, horizon=5, windows=windows)
    assert unseen.max() == 0.0  # past the window and longer than any period seen


def test_the_hybrid_window_is_a_floor_under_the_hazard() -> None:
    gaps = np.full(10, 30.0)
    answer = idletimes.within_after(gaps, elapsed=5, horizon=3, windows=(0.0, 60.0))
    assert answer.tolist() == [1.0, 1.0, 1.0]


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
