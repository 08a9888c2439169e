"""The hybrid histogram keep-alive policy of "Serverless in the Wild" (Shahrad et al., ATC'20).

Per function, a histogram of idle times (time between the end of one invocation and the start
of the next) in 1-minute bins over a 4-hour range decides two windows after each invocation:
the *pre-warm* window (unload the instance, load it again this long after the invocation) and
the *keep-alive* window (then keep it loaded this long; measured from the end of the pre-warm
window, as dslab and OpenDC do).
- Representative histogram (coefficient of variation of the bin counts >= 2): pre-warm at the
  5th percentile of idle times minus a 10 % margin, keep-alive up to the 99th plus 10 %.
- Not representative (including "no data yet"): no pre-warm, keep alive for the whole range.
- Mostly out of range (>= half the idle times beyond 4 h): forecast the next idle time with a
  time-series model and pre-warm at 0.85x it, keeping alive 0.3x it around it. The paper uses
  ARIMA; with the few idle times one day offers such functions, we fit ARIMA(1,0,0), i.e. AR(1)
  by least squares over the last 64 idle times, falling back to their mean when it is unstable.
Parameters: baselines.md (paper; dslab `hybrid_histogram.rs`; OpenDC). One implementation:
the forecaster serves it per function and the simulator runs it in batch, through the same
numba kernels below. State is one float64 vector per function (see `STATE_SIZE`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class HistogramParams:
    """The published parameters (baselines.md); minutes throughout."""

    range_minutes: float = 240.0  # 4 hours; longer idle times are out of bounds
    bin_minutes: float = 1.0
    head: float = 0.05  # pre-warm percentile
    tail: float = 0.99  # keep-alive percentile (one secondary source says 0.95)
    margin: float = 0.10  # histogram windows: pre-warm x (1 - margin), keep-alive x (1 + margin)
    cv_threshold: float = 2.0  # bin-count CV below this: histogram not representative
    oob_threshold: float = 0.5  # out-of-bounds share that switches to the time-series forecast
    forecast_margin: float = 0.15  # pre-warm at forecast x 0.85, keep alive forecast x 0.3

    @property
    def bins(self) -> int:
        return int(round(self.range_minutes / self.bin_minutes))


RAW_WINDOW = 64  # idle times kept for the time-series forecast
_SUM, _SQUARES, _OOB, _SEEN = 0, 1, 2, 3  # scalar slots after the bins
_SCALARS = 4


def state_size(params: HistogramParams) -> int:
    """Length of one function's state vector: bins, four scalars, the raw ring."""
    return params.bins + _SCALARS + RAW_WINDOW


# Positions in the parameter vector the kernels take (numba wants plain arrays, not objects).
_BINS, _BIN_MINUTES, _RANGE, _HEAD, _TAIL, _MARGIN, _CV, _OOB_SHARE, _FORECAST_MARGIN = range(9)


def _vector(params: HistogramParams) -> FloatArray:
    return np.array(
        [
            params.bins,
            params.bin_minutes,
            params.range_minutes,
            params.head,
            params.tail,
            params.margin,
            params.cv_threshold,
            params.oob_threshold,
            params.forecast_margin,
        ],
        dtype=np.float64,
    )


@numba.njit(cache=True)
def observe(state: FloatArray, idle_minutes: float, p: FloatArray) -> None:
    """Record one idle time."""
    bins = int(p[_BINS])
    seen = int(state[bins + _SEEN])
    state[bins + _SCALARS + seen % RAW_WINDOW] = idle_minutes
    state[bins + _SEEN] = seen + 1
    index = int(math.floor(idle_minutes / p[_BIN_MINUTES]))
    if 0 <= index < bins:
        state[bins + _SQUARES] += 2.0 * state[index] + 1.0  # sum of squared counts, kept exact
        state[index] += 1.0
        state[bins + _SUM] += 1.0
    else:
        state[bins + _OOB] += 1.0


@numba.njit(cache=True)
def windows(state: FloatArray, p: FloatArray) -> tuple[float, float]:
    """(pre-warm, keep-alive) in minutes for the next idle period, from the state so far."""
    bins = int(p[_BINS])
    total = state[bins + _SUM]
    oob = state[bins + _OOB]
    if oob + total > 0 and oob / (oob + total) >= p[_OOB_SHARE]:
        forecast = _forecast_idle(state, bins)
        return forecast * (1.0 - p[_FORECAST_MARGIN]), forecast * p[_FORECAST_MARGIN] * 2.0
    if total == 0 or _coefficient_of_variation(state, bins) < p[_CV]:
        return 0.0, p[_RANGE]
    head_bin = _percentile_bin(state, bins, p[_HEAD])
    tail_bin = _percentile_bin(state, bins, p[_TAIL])
    width = p[_BIN_MINUTES]
    return head_bin * width * (1.0 - p[_MARGIN]), (1 + tail_bin) * width * (1.0 + p[_MARGIN])


@numba.njit(cache=True)
def _coefficient_of_variation(state: FloatArray, bins: int) -> float:
    total = state[bins + _SUM]
    mean = total / bins
    variance = (state[bins + _SQUARES] - bins * mean * mean) / (bins - 1)
    return float(math.sqrt(max(variance, 0.0)) / mean)


@numba.njit(cache=True)
def _percentile_bin(state: FloatArray, bins: int, level: float) -> int:
    total = state[bins + _SUM]
    prefix = 0.0
    for i in range(bins):
        prefix += state[i]
        if prefix / total >= level:
            return i
    return bins - 1


@numba.njit(cache=True)
def _forecast_idle(state: FloatArray, bins: int) -> float:
    """AR(1) one-step forecast of the next idle time over the raw ring, oldest first."""
    seen = int(state[bins + _SEEN])
    n = min(seen, RAW_WINDOW)
    start = seen - n
    values = np.empty(n)
    for i in range(n):
        values[i] = state[bins + _SCALARS + (start + i) % RAW_WINDOW]
    mean = float(values.mean())
    if n < 3:
        return float(values[n - 1]) if n == 1 else mean
    x, y = values[:-1], values[1:]
    x_mean, y_mean = x.mean(), y.mean()
    spread = ((x - x_mean) ** 2).sum()
    if spread <= 0.0:
        return mean
    phi = float(((x - x_mean) * (y - y_mean)).sum() / spread)
    if not -0.99 < phi < 0.99:
        return mean
    forecast = float(y_mean + phi * (values[n - 1] - x_mean))
    return forecast if forecast > 0.0 else mean


@numba.njit(cache=True)
def run_batch(
    gaps: FloatArray, offsets: npt.NDArray[np.int64], state_length: int, p: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Online over many functions: the windows in force before each gap, then observe it.

    `gaps[offsets[f]:offsets[f + 1]]` are function f's idle times in order.
    """
    prewarm = np.empty(gaps.size)
    keepalive = np.empty(gaps.size)
    state = np.zeros(state_length)
    for f in range(offsets.size - 1):
        state[:] = 0.0
        for i in range(offsets[f], offsets[f + 1]):
            prewarm[i], keepalive[i] = windows(state, p)
            observe(state, gaps[i], p)
    return prewarm, keepalive


@dataclass(frozen=True, slots=True)
class Windows:
    prewarm_minutes: float
    keepalive_minutes: float


class HybridHistogram:
    """One function's histogram, updated online (the forecaster's per-function view)."""

    def __init__(self, params: HistogramParams | None = None) -> None:
        self.params = params or HistogramParams()
        self._vector = _vector(self.params)
        self.state = np.zeros(state_size(self.params))

    def observe(self, idle_minutes: float) -> None:
        observe(self.state, float(idle_minutes), self._vector)

    def windows(self) -> Windows:
        prewarm, keepalive = windows(self.state, self._vector)
        return Windows(prewarm_minutes=float(prewarm), keepalive_minutes=float(keepalive))


def batch_windows(
    gaps: FloatArray, offsets: npt.NDArray[np.int64], params: HistogramParams | None = None
) -> tuple[FloatArray, FloatArray]:
    """The windows `HybridHistogram` would give before each gap, for many functions at once."""
    p = params or HistogramParams()
    gaps = np.ascontiguousarray(gaps, dtype=np.float64)
    return run_batch(gaps, np.ascontiguousarray(offsets, dtype=np.int64), state_size(p), _vector(p))
