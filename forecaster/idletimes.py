"""When the next invocation comes, from a function's own idle times and everyone else's.

A per-minute model forecasts a rate; it cannot tell that a function triggered every 30
minutes is certain to be invoked 30 minutes after its last invocation and almost certainly not
at 10. Its idle times can, as a discrete hazard: of its past idle periods that lasted at least
`e` minutes, the share that ended at exactly `e`. Few periods say little, so each function's
hazard is shrunk towards the *pooled* hazard of every function's idle times (empirical Bayes:
`strength` pseudo-periods drawn from the pool): a new function starts from what functions in
general do (most idle periods are short, and the longer one lasts the less likely it ends in
the next minute), and its own timing takes over as its periods accumulate. A timer-like
function's hazard is a spike at its period: it is warmed just before its next call and
released right after, with no class-specific rule.

The pool counts the periods still running too (censored, as in a Kaplan-Meier estimate): a
function idle for three hours says that idle periods do not all end within three hours, and
leaving it out made long periods look likelier to end than they are. Where the pool has few
periods at risk (long idle times, and every idle time in the first hours of history), it is
shrunk towards one constant hazard, its calls per idle minute from `TAIL_FROM` minutes on:
without it, no period yet that long read as "never called again" (docs/prewarm.md: "Where the
pool knows little, it no longer says never").

The hybrid histogram of "Serverless in the Wild" (`histogram`) answers the same question with
one window per function, and for functions it knows little of that window is four hours long;
the hazard spends memory minute by minute where an invocation is likely (docs/prewarm.md).

Idle periods are whole minutes between invocation minutes (1 = consecutive minutes), kept as
counts per length up to `RANGE_MINUTES` and one bin beyond, so a function's state is one small
vector and the pool is their sum. Everything takes many functions at once, one row each.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

RANGE_MINUTES = 240  # the hybrid histogram's range; longer periods share the last bin
BINS = RANGE_MINUTES + 2  # index e = a period of e minutes (1..RANGE_MINUTES); the last: beyond
PRIOR_STRENGTH = 2.0  # pseudo-periods: of the pool in each function's hazard, of the tail in the pool's
TAIL_FROM = 10  # minutes: the pool's long periods, whose rate stands in where it has none
MIN_PERIODS = 4  # fewer idle periods than this: a new function, the pool speaks for it


class Pattern(StrEnum):
    """What a function's idle times look like: published in plans and `/debug/functions`."""

    NEW = "new"  # fewer than MIN_PERIODS idle periods
    ALWAYS_WARM = "always-warm"  # invoked (nearly) every minute
    PERIODIC = "periodic"  # timer-like: most periods within a minute of one length
    BURSTY = "bursty"  # runs of short periods between long silences
    SPARSE = "sparse"  # irregular, mostly long periods


def counts(gaps: npt.ArrayLike) -> FloatArray:
    """Idle periods (minutes) as counts per length, the last bin for all beyond the range."""
    lengths = np.clip(np.asarray(gaps, dtype=np.int64), 1, BINS - 1)
    return np.bincount(lengths, minlength=BINS).astype(np.float64)


def pooled_hazard(pooled: FloatArray, running: FloatArray | None = None) -> FloatArray:
    """The hazard of summed counts: index e = P(a period ends at e | it lasted >= e), shrunk
    towards `tail_rate` by `PRIOR_STRENGTH` pseudo-periods (so where none is at risk it is that
    rate, not 0); index 0 unused, and the beyond bin takes the hazard at the range's end (a flat
    tail). `running`: the `counts` of the periods still running by elapsed minutes (`within_after`'s
    convention: at E the next minute would end a period of E), at risk below E, ended nowhere."""
    at_risk = np.cumsum(pooled[::-1])[::-1]
    if running is not None:
        at_risk[:-1] += np.cumsum(running[::-1])[::-1][1:]
    hazard = np.zeros(BINS)
    rate = tail_rate(pooled, running)
    hazard[1:-1] = (pooled[1:-1] + PRIOR_STRENGTH * rate) / (at_risk[1:-1] + PRIOR_STRENGTH)
    hazard[-1] = hazard[-2]
    return hazard


def tail_rate(pooled: FloatArray, running: FloatArray | None = None) -> float:
    """The constant hazard of idle periods from `TAIL_FROM` minutes on, within the range: the
    periods that ended there per idle minute every period (ended, beyond the range or running)
    spent there; 0 before any did."""
    lengths = np.arange(BINS)
    most = RANGE_MINUTES - TAIL_FROM + 1
    minutes = float(pooled @ np.clip(lengths - TAIL_FROM + 1, 0, most))  # ended at e: at risk to e
    if running is not None:
        minutes += float(running @ np.clip(lengths - TAIL_FROM, 0, most))  # at E: to E - 1
    ended = float(pooled[TAIL_FROM:-1].sum())
    return ended / minutes if minutes else 0.0


def within_after(
    own: FloatArray, elapsed: IntArray, horizon: int, prior: FloatArray, strength: float = PRIOR_STRENGTH
) -> FloatArray:
    """P(next invocation within the next k minutes), k = 1..horizon, one row per function,
    never decreasing in k.

    `own`: the functions' `counts`, one row each; `elapsed`: minutes since each one's last
    invocation minute (1 = it was the previous minute), so the next k minutes end periods of
    elapsed .. elapsed + k - 1; `prior`: the `pooled_hazard`.
    """
    own = np.atleast_2d(own)
    at_risk = np.cumsum(own[:, ::-1], axis=1)[:, ::-1]
    start = np.maximum(np.asarray(elapsed, dtype=np.int64).reshape(-1, 1), 1)
    lengths = np.minimum(start + np.arange(horizon), BINS - 1)
    rows = np.arange(own.shape[0]).reshape(-1, 1)
    ends = np.where(lengths < BINS - 1, own[rows, lengths], 0.0)  # beyond the range: no timing known
    hazard = (ends + strength * prior[lengths]) / (at_risk[rows, lengths] + strength)
    return np.asarray(1.0 - np.cumprod(1.0 - np.clip(hazard, 0.0, 1.0), axis=1), dtype=np.float64)


def patterns(own: FloatArray) -> list[Pattern]:
    """Each function's class from its idle-time counts (one row each)."""
    own = np.atleast_2d(own)
    periods = own.sum(axis=1)
    mode = np.argmax(own[:, 2:-1], axis=1) + 2
    rows = np.arange(own.shape[0])
    around_mode = own[rows, mode - 1] + own[rows, mode] + own[rows, mode + 1]
    classes = np.select(
        [
            periods < MIN_PERIODS,
            own[:, 1] >= 0.9 * periods,
            around_mode >= 0.75 * periods,
            (own[:, 1:3].sum(axis=1) >= 0.5 * periods) & (own[:, 10:].sum(axis=1) > 0),
        ],
        [Pattern.NEW.value, Pattern.ALWAYS_WARM.value, Pattern.PERIODIC.value, Pattern.BURSTY.value],
        Pattern.SPARSE.value,
    )
    return [Pattern(c) for c in classes.tolist()]
