"""When the next invocation comes, from a function's own idle times (its empirical hazard).

A per-minute model forecasts a rate; it cannot tell that a function triggered every 30
minutes is certain to be invoked 30 minutes after its last invocation and almost certainly not
at 10. Its idle times can: given that the function has been idle for `elapsed` minutes, the
chance that its next invocation falls within the next k minutes is the share of its past idle
periods that ended in that range among those that lasted at least `elapsed`. One pseudo-period
that never ends keeps the answer below certainty on little data.

The hybrid histogram's windows answer too, as a verdict: 1 where its keep-alive window (after
its pre-warm window) reaches into the next k minutes, else 0; the answer is the larger of the
two. The verdict alone answers where the idle times say too little (few periods, or an idle
time longer than any seen): that policy was built for little data and functions gone quiet,
and the hazard only adds warmth where timing is known (in the simulator this halves the
hybrid's cold starts on the functions prewarming may touch, at its wasted memory:
docs/prewarm.md).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

MIN_PERIODS = 4  # fewer idle periods than this say too little about the next one


def within_after(gaps: FloatArray, elapsed: int, horizon: int, windows: tuple[float, float]) -> FloatArray:
    """P(next invocation within the next k minutes), k = 1..horizon, never decreasing in k.

    `gaps`: past idle periods in whole minutes between invocation minutes (1 = consecutive
    minutes); `elapsed`: minutes since the last invocation minute (1 = it was the previous
    minute); `windows`: the hybrid histogram's (pre-warm, keep-alive) minutes after it, the
    only answer when the idle times say too little (fewer than `MIN_PERIODS` periods, or none
    as long as the current one).
    """
    prewarm, keepalive = windows
    k = np.arange(1, horizon + 1)
    verdict = ((prewarm < elapsed + k) & (elapsed <= prewarm + keepalive)).astype(np.float64)
    longer = gaps[gaps >= elapsed]
    if gaps.size < MIN_PERIODS or longer.size == 0:
        return verdict
    # The next invocation k minutes from now ends a period of elapsed - 1 + k minutes.
    ends = np.bincount(np.clip(longer - elapsed, 0, horizon).astype(np.int64), minlength=horizon + 1)
    return np.maximum(np.cumsum(ends[:horizon]) / (longer.size + 1.0), verdict)
