"""Keep-alive study mode: one instance per function, warm or cold, as SitW simulated it.

At the trace's one-minute resolution: the first invocation in a minute finds the instance
loaded (warm) or not (cold, and the instance starts); the other invocations of that minute
are warm. The idle period between two invocation minutes m < m' is m' - m minutes (execution
time inside a minute is not modelled, as in SitW). With windows (pre-warm p, keep-alive k) in
force after the invocation at m, the next one is warm iff p <= idle <= p + k; the instance
holds memory, wasted, for idle - p minutes when warm, k when it was unloaded again, 0 when the
next invocation came before the pre-warm. After the last invocation it holds memory until
its windows or the trace end. Everything is vectorised over functions; the policy decides in
one online batch (see `keepalive`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from simulator.keepalive import KeepAlivePolicy

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Outcome:
    """Per function: invocations, cold starts, and idle loaded time (minutes)."""

    invocations: IntArray
    cold_starts: IntArray
    wasted_minutes: FloatArray

    @property
    def cold_start_pct(self) -> FloatArray:
        return 100.0 * self.cold_starts / np.maximum(self.invocations, 1)


@dataclass(frozen=True)
class IdlePeriods:
    """The invocation minutes of many functions, as the idle periods keep-alive policies see.

    Each invoked function has one period after each invocation minute: the gap to its next
    invocation minute, and last the time to the end of the trace (`is_tail`), for which the
    instance may stay loaded but no invocation is judged.
    """

    minutes: FloatArray  # length of each idle period, function by function
    offsets: IntArray  # function f's periods are minutes[offsets[f]:offsets[f + 1]]
    is_tail: npt.NDArray[np.bool_]
    invocations: IntArray

    @classmethod
    def from_counts(cls, counts: IntArray) -> IdlePeriods:
        functions, minute = np.nonzero(counts)  # row-major: by function, then minute
        per_function = np.bincount(functions, minlength=counts.shape[0])
        offsets = np.concatenate(([0], np.cumsum(per_function))).astype(np.int64)
        last = offsets[1:][per_function > 0] - 1
        following = np.empty_like(minute)
        following[:-1] = minute[1:]
        following[last] = counts.shape[1]  # the trace end closes each function's last period
        is_tail = np.zeros(minute.size, dtype=np.bool_)
        is_tail[last] = True
        return cls(
            minutes=(following - minute).astype(np.float64),
            offsets=offsets,
            is_tail=is_tail,
            invocations=counts.sum(axis=1),
        )


def run(periods: IdlePeriods, policy: KeepAlivePolicy) -> Outcome:
    """Cold starts and wasted instance time of every function under `policy`."""
    prewarm, keepalive = policy.windows(periods.minutes, periods.offsets)
    idle = periods.minutes
    warm = (prewarm <= idle) & (idle <= prewarm + keepalive)
    loaded = np.where(idle < prewarm, 0.0, np.where(warm, idle - prewarm, keepalive))
    loaded = np.where(periods.is_tail, np.clip(idle - prewarm, 0.0, keepalive), loaded)
    cold = ~warm & ~periods.is_tail  # the invocation that ends the period found no instance
    owner = np.repeat(np.arange(len(periods.offsets) - 1), np.diff(periods.offsets))
    n = len(periods.invocations)
    first = (periods.invocations > 0).astype(np.int64)  # every function starts cold
    return Outcome(
        invocations=periods.invocations,
        cold_starts=first + np.bincount(owner, weights=cold, minlength=n).astype(np.int64),
        wasted_minutes=np.bincount(owner, weights=loaded, minlength=n).astype(np.float64),
    )
