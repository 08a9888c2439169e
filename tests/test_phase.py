"""The phase answer (the same minutes of the last hours) and the losses that choose it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from forecaster import idletimes, phase
from forecaster.forecasting import Forecast, idle_answers
from forecaster.history import idle_minutes

HORIZON = 5
LOOKAHEAD = 3


def hourly_bursts(hours: int, *, at: int = 6, strays: tuple[int, ...] = ()) -> np.ndarray:
    """Calls per minute: a burst at minute `at` of every hour, and in hour h a stray call
    `strays[h % len(strays)]` minutes after it (0: none)."""
    counts = np.zeros(hours * 60, dtype=np.int64)
    for hour in range(hours):
        counts[hour * 60 + at] = 200
        if strays and strays[hour % len(strays)]:
            counts[hour * 60 + at + strays[hour % len(strays)]] = 1
    return counts


def by_phase(series: np.ndarray, idle: float) -> np.ndarray:
    return phase.within_by_phase((series > 0)[None, :], np.full((1, HORIZON), idle))[0]


def test_a_burst_at_a_fixed_minute_is_expected_at_that_minute_of_the_hour() -> None:
    history = hourly_bursts(12)
    # Now is minute 4 of hour 11: the burst at minute 6 fell on k = 3 in each of the 11 before.
    due = by_phase(history[: 11 * 60 + 4], idle=0.5)
    assert due[:2] == pytest.approx([0.5 * 2 / 13, 0.5 * 2 / 13])  # 11 hours, none with a call there
    assert due[2] == pytest.approx((11 + 1.0) / 13)
    # Minute 30: nothing in the next five minutes of any hour, only the shrinkage is left.
    quiet = by_phase(history[: 11 * 60 + 30], idle=0.5)
    assert quiet.max() == pytest.approx(1.0 / 13)


def test_no_phase_answer_for_short_or_rarely_called_histories() -> None:
    assert np.isnan(by_phase(hourly_bursts(3), idle=0.5)).all()  # three hours: too few
    rare = np.zeros(12 * 60, dtype=np.int64)
    rare[[10, 200, 400]] = 1  # called in 3 of 12 hours
    assert np.isnan(by_phase(rare, idle=0.5)).all()
    # No idle-time answer (never invoked): no phase answer.
    answer = phase.within_by_phase(np.ones((1, 720), dtype=np.bool_), np.full((1, HORIZON), np.nan))
    assert np.isnan(answer).all()


def test_stray_calls_dilute_the_idle_answer_but_not_the_phase_one() -> None:
    # A burst at :06, and some hours a stray call 3 to 20 minutes after it: each restarts the
    # idle clock, so the idle time before the next burst varies and the idle answer hedges.
    history = {"ns/timer": hourly_bursts(12, strays=(3, 20, 0, 8, 14))[: 11 * 60 + 4]}
    gaps = {f: idle_minutes(s) for f, s in history.items()}
    idle, _, elapsed, by_minute = idle_answers(history, gaps, HORIZON)["ns/timer"]
    assert elapsed == 60 - (6 + 3) + 4 and idle is not None and by_minute is not None  # hour 10: +3
    assert by_minute[LOOKAHEAD - 1] > 0.9 > idle[LOOKAHEAD - 1]


def forecast(minute: int, *, idle: float, by_phase: float, elapsed: int) -> Forecast:
    return Forecast(
        function="ns/fn",
        start_minute=minute,
        expected=np.zeros(HORIZON),
        p_invoked=np.zeros(HORIZON),
        p_within=np.zeros(HORIZON),
        prewarm_minutes=0.0,
        keepalive_minutes=10.0,
        model="Naive",
        relative_mae=None,
        p_within_idle=np.full(HORIZON, idle),
        elapsed_minutes=elapsed,
        p_within_phase=np.full(HORIZON, by_phase),
    )


def replay(phase_right: bool, minutes: int = 60) -> list[bool]:
    """A function invoked at every fourth minute (0, 4, 8, ...); one answer says 0.9 before each
    call within the lookahead and 0.1 otherwise, the other 0.5 throughout. Returns whether the
    phase answer was chosen, minute by minute from minute 1."""
    scores = phase.Scores()
    chosen = []
    for minute in range(1, minutes):
        due = any(m % 4 == 0 for m in range(minute, minute + LOOKAHEAD))
        sharp, flat = (0.9 if due else 0.1), 0.5
        made = forecast(
            minute,
            idle=flat if phase_right else sharp,
            by_phase=sharp if phase_right else flat,
            elapsed=minute - 4 * ((minute - 1) // 4),  # since the last call before this minute
        )
        chosen.append(scores.choose({"ns/fn": made}, LOOKAHEAD)["ns/fn"].phase_chosen)
    return chosen


def test_the_phase_answer_is_taken_only_once_it_has_scored_better() -> None:
    chosen = replay(phase_right=True)
    assert not any(chosen[:LOOKAHEAD])  # nothing judged yet: the idle-time answer
    assert all(chosen[-20:])
    assert not any(replay(phase_right=False))


def test_the_chosen_answer_is_what_the_planner_reads() -> None:
    made = forecast(10, idle=0.2, by_phase=0.7, elapsed=5)
    assert made.answer == "idle" and made.best_p_within[0] == pytest.approx(0.2)
    taken = replace(made, phase_chosen=True)
    moved = taken.later(0, p_within_idle=made.p_within_idle, p_within_phase=made.p_within_phase)
    assert not moved.phase_chosen  # a moved-on forecast is judged afresh
    assert taken.answer == "phase" and taken.best_p_within[0] == pytest.approx(0.7)
    assert taken.as_json()["p_within_phase"] == [0.7] * HORIZON


def test_a_skipped_minute_drops_its_answers_instead_of_misjudging_them() -> None:
    scores = phase.Scores()
    scores.choose({"ns/fn": forecast(0, idle=0.1, by_phase=0.9, elapsed=2)}, LOOKAHEAD)
    # The next cycle comes 5 minutes later: the answers of minute 0 are past their lookahead.
    scores.choose({"ns/fn": forecast(5, idle=0.1, by_phase=0.9, elapsed=1)}, LOOKAHEAD)
    assert scores.losses == {} and list(scores.pending) == [5]
    scores.choose({"ns/fn": forecast(8, idle=0.1, by_phase=0.9, elapsed=1)}, LOOKAHEAD)
    idle_loss, phase_loss = scores.losses["ns/fn"]
    assert idle_loss == pytest.approx(-np.log(0.1)) and phase_loss == pytest.approx(-np.log(0.9))


def test_resumed_scores_choose_as_before_and_decay_over_the_downtime() -> None:
    before = phase.Scores()
    for minute in range(0, 8):  # the phase answer is the sharper one: invoked every minute
        before.choose({"ns/fn": forecast(minute, idle=0.3, by_phase=0.95, elapsed=1)}, LOOKAHEAD)
    judged = before.judged()
    assert judged is not None and judged.minute == 7
    resumed = phase.Scores.resumed(judged)  # a restart: nothing awaits judgment any more
    assert resumed.choose({"ns/fn": forecast(20, idle=0.3, by_phase=0.95, elapsed=1)}, LOOKAHEAD)[
        "ns/fn"
    ].phase_chosen
    assert (
        not phase.Scores()
        .choose({"ns/fn": forecast(20, idle=0.3, by_phase=0.95, elapsed=1)}, LOOKAHEAD)["ns/fn"]
        .phase_chosen
    )
    # Judged again 3 minutes on: the losses kept at minute 7 have decayed over 16 minutes.
    resumed.choose({"ns/fn": forecast(23, idle=0.3, by_phase=0.95, elapsed=1)}, LOOKAHEAD)
    decay = 0.5 ** (16 / phase.HALF_LIFE_MINUTES)
    kept, judged_now = np.array(judged.losses["ns/fn"]), phase.log_loss(np.array([0.3, 0.95]), np.bool_(True))
    assert resumed.losses["ns/fn"] == pytest.approx(kept * decay + judged_now)


def test_damaged_kept_losses_are_dropped_not_trusted(caplog: pytest.LogCaptureFixture) -> None:
    judged = phase.Judged(5, {"ns/ok": (1.0, 0.5), "ns/nan": (float("nan"), 0.5), "ns/neg": (1.0, -2.0)})
    resumed = phase.Scores.resumed(judged)
    assert list(resumed.losses) == ["ns/ok"] and resumed.judged_minute == 5
    assert "2 functions" in caplog.text
    assert phase.Scores.resumed(None).judged() is None


def test_idletimes_strength_is_the_phase_shrinkage() -> None:
    # Documented in `phase`: the pseudo-hours are the idle-time answer's pseudo-periods.
    due = by_phase(hourly_bursts(12)[: 11 * 60 + 4], idle=0.0)
    assert due[2] == pytest.approx(11 / (11 + idletimes.PRIOR_STRENGTH))
