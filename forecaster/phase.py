"""When the next invocation comes, from the same minutes of the hours before.

The idle-time hazard (`idletimes`) conditions on the minutes since a function's last call. A
function whose calls come in bursts at a fixed minute of the hour, with stray calls between
them, restarts that clock at every stray call, and its answer before the next burst is diluted
(docs/prewarm.md: seed 15's bursty functions). The minute within the hour does not move: of the
last `CYCLES` hours, the share that had a call within k minutes of this very minute is a direct
answer, shrunk towards the idle-time one (`idletimes.PRIOR_STRENGTH` pseudo-hours).

Neither answer is right for every function (a timer every seven minutes drifts through the
hour), so `Scores` keeps each function's log loss of both at the planner's lookahead, decayed
over hours, and a function takes the phase answer only while it has been clearly the better one.
Functions called in fewer than half of the hours have no phase answer: for a rarely called
function a low answer everywhere scores well on the many minutes without a call, and would
starve it of warmth before the call that matters.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from forecaster import idletimes

if TYPE_CHECKING:
    from forecaster.forecasting import Forecast

logger = logging.getLogger(__name__)

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

PERIOD_MINUTES = 60
CYCLES = 12  # hours looked back: the forecaster's 12-hour window
MIN_CYCLES = 4  # fewer whole hours of history: no phase answer
ACTIVE_SHARE = 0.5  # called in fewer of those hours: no phase answer
HALF_LIFE_MINUTES = 360.0  # of the losses that choose between the answers
MARGIN = 0.05  # the phase answer's loss must be this much below the idle-time answer's
_CLIP = 1e-4  # log loss of answers of exactly 0 or 1 stays finite


def within_by_phase(invoked: BoolArray, idle_within: FloatArray) -> FloatArray:
    """P(next invocation within the next k minutes), k = 1..horizon, one row per function, from
    the same minutes of the last hours; NaN rows where a function has no phase answer.

    `invoked`: whether each function was invoked in each minute so far, one row each, the last
    column the minute just ended; `idle_within`: the `idletimes.within_after` answers (rows, horizon)
    the hits are shrunk towards (NaN rows: no idle-time answer, so no phase answer either).
    """
    invoked = np.atleast_2d(invoked)
    rows, minutes = invoked.shape
    horizon = idle_within.shape[1]
    hits = np.zeros((rows, horizon))
    active = np.zeros(rows)
    cycles = 0
    for back in range(1, CYCLES + 1):
        start = minutes - back * PERIOD_MINUTES
        if start < 0 or start + horizon > minutes:
            break
        hits += np.logical_or.accumulate(invoked[:, start : start + horizon], axis=1)
        active += invoked[:, start : start + PERIOD_MINUTES].any(axis=1)
        cycles += 1
    strength = idletimes.PRIOR_STRENGTH
    answer = (hits + strength * idle_within) / (cycles + strength)
    answer[(active < max(ACTIVE_SHARE * cycles, 1.0)) | (cycles < MIN_CYCLES)] = np.nan
    return np.asarray(answer, dtype=np.float64)


def known(answers: FloatArray) -> list[FloatArray | None]:
    """Each row of `answers`, None where it is unknown (NaN); one pass over the whole table."""
    unknown: list[bool] = np.asarray(np.isnan(answers).any(axis=1), dtype=np.bool_).tolist()
    return [None if missing else row for missing, row in zip(unknown, answers, strict=True)]


def log_loss(probability: FloatArray, outcome: BoolArray) -> FloatArray:
    p = np.clip(probability, _CLIP, 1.0 - _CLIP)
    return np.asarray(-np.where(outcome, np.log(p), np.log(1.0 - p)), dtype=np.float64)


@dataclass(frozen=True, slots=True)
class Judged:
    """What `Scores` has learned, as plain numbers to keep across a restart: each function's
    decayed (idle-time, phase) log losses as they stood at `minute`."""

    minute: int
    losses: Mapping[str, tuple[float, float]]


@dataclass
class Scores:
    """Each function's decayed log loss of the idle-time and the phase answer at the planner's
    lookahead, judged as the minutes pass; `choose` marks the forecasts that take the phase one.

    The service keeps `judged()` in its history database and `resumed` goes on from it after a
    restart, so a function that took the phase answer takes it again at once. Only the answers
    still awaiting their outcome (the last `lookahead` minutes') are not kept."""

    losses: dict[str, FloatArray] = field(default_factory=dict)  # function -> [idle, phase]
    # minute -> function -> [idle, phase] answers at the lookahead, awaiting their outcome
    pending: dict[int, dict[str, FloatArray]] = field(default_factory=dict)
    judged_minute: int | None = None

    @classmethod
    def resumed(cls, judged: Judged | None) -> Scores:
        """Scores that go on from `judged` (None: from nothing). Losses that are not finite and
        non-negative (a damaged database) are dropped: those functions start afresh."""
        if judged is None:
            return cls()
        losses = {
            name: np.array(loss, dtype=np.float64)
            for name, loss in judged.losses.items()
            if all(math.isfinite(x) and x >= 0.0 for x in loss)
        }
        if len(losses) < len(judged.losses):
            logger.warning(
                "dropped the answer losses of %d functions (not finite, or negative); they start afresh",
                len(judged.losses) - len(losses),
            )
        return cls(losses=losses, judged_minute=judged.minute)

    def judged(self) -> Judged | None:
        """The losses as plain numbers; None before anything has been judged."""
        if self.judged_minute is None:
            return None
        losses = {name: (float(loss[0]), float(loss[1])) for name, loss in self.losses.items()}
        return Judged(self.judged_minute, losses)

    def choose(self, forecasts: Mapping[str, Forecast], lookahead: int) -> dict[str, Forecast]:
        """`forecasts` (all made at one minute) with `phase_chosen` set where the phase answer
        has been the better one; their answers are kept to be judged `lookahead` minutes on."""
        if not forecasts:
            return {}
        minute = max(f.start_minute for f in forecasts.values())
        self._judge(minute, forecasts, lookahead)
        answers = {
            name: np.array([f.p_within_idle[lookahead - 1], f.p_within_phase[lookahead - 1]])
            for name, f in forecasts.items()
            if f.p_within_idle is not None and f.p_within_phase is not None
        }
        self.pending[minute] = answers
        chosen = {name for name in answers if self._phase_better(name)}
        # A copy only where the choice changes the forecast: 10,000 copies a cycle cost 0.1 s.
        return {
            name: f if f.phase_chosen == (name in chosen) else replace(f, phase_chosen=name in chosen)
            for name, f in forecasts.items()
        }

    def _phase_better(self, function: str) -> bool:
        loss = self.losses.get(function)
        return loss is not None and bool(loss[1] < (1.0 - MARGIN) * loss[0])

    def _judge(self, minute: int, forecasts: Mapping[str, Forecast], lookahead: int) -> None:
        """Score the answers made `lookahead` minutes ago: a function was invoked since then
        when its last call is at most `lookahead` minutes old. Older unjudged answers (a
        skipped cycle) are dropped, not guessed."""
        made = self.pending.pop(minute - lookahead, None)
        for stale in [m for m in self.pending if m <= minute - lookahead]:
            del self.pending[stale]
        if made is None:
            return
        if self.judged_minute is not None:  # decay, and forget functions no longer forecast
            decay = 0.5 ** ((minute - self.judged_minute) / HALF_LIFE_MINUTES)
            self.losses = {name: loss * decay for name, loss in self.losses.items() if name in forecasts}
        self.judged_minute = minute
        for name, answer in made.items():
            forecast = forecasts.get(name)
            if forecast is None or forecast.elapsed_minutes is None:
                continue
            outcome = np.bool_(forecast.elapsed_minutes <= lookahead)
            self.losses.setdefault(name, np.zeros(2))
            self.losses[name] += log_loss(answer, np.full(2, outcome))
