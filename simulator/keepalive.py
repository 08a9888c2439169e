"""Keep-alive (and pre-warm) policies: when an idle function instance stays loaded.

A policy sees each function's idle times in order and answers, before each idle period, the
windows in force: unload and pre-warm after `prewarm` minutes, then keep the instance loaded
for `keepalive` minutes (measured from the end of the pre-warm). It answers in batch over many
functions at once, but online: the window before idle period i may depend only on the idle
periods before it. The prewarm planner plugs in through the same interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from forecaster import histogram

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# Knative's default scale-to-zero: a revision with no traffic over the 60 s stable window is
# scaled to zero after the 30 s scale-to-zero grace period (config-autoscaler, protocols.md §3.4).
KNATIVE_STABLE_WINDOW_S = 60.0
KNATIVE_SCALE_TO_ZERO_GRACE_S = 30.0


class KeepAlivePolicy(Protocol):
    @property
    def name(self) -> str: ...

    def windows(self, gaps: FloatArray, offsets: IntArray) -> tuple[FloatArray, FloatArray]:
        """(pre-warm, keep-alive) minutes before each idle period.

        `gaps[offsets[f]:offsets[f + 1]]` are function f's idle periods in minutes, in order;
        the answer for period i may use only periods before i.
        """


@dataclass(frozen=True)
class FixedKeepAlive:
    """Keep every instance loaded for a fixed time after its last invocation; never pre-warm."""

    minutes: float

    @property
    def name(self) -> str:
        return f"fixed:{self.minutes:g}"

    def windows(self, gaps: FloatArray, offsets: IntArray) -> tuple[FloatArray, FloatArray]:
        return np.zeros(gaps.size), np.full(gaps.size, self.minutes)


@dataclass(frozen=True)
class KnativeDefault:
    """Knative's defaults: scale to zero once the stable window and the grace period pass."""

    name: str = "knative"

    def windows(self, gaps: FloatArray, offsets: IntArray) -> tuple[FloatArray, FloatArray]:
        keepalive = (KNATIVE_STABLE_WINDOW_S + KNATIVE_SCALE_TO_ZERO_GRACE_S) / 60.0
        return np.zeros(gaps.size), np.full(gaps.size, keepalive)


@dataclass(frozen=True)
class HybridHistogramPolicy:
    """The hybrid histogram policy of "Serverless in the Wild", via `forecaster.histogram`."""

    params: histogram.HistogramParams = histogram.HistogramParams()
    name: str = "hybrid"

    def windows(self, gaps: FloatArray, offsets: IntArray) -> tuple[FloatArray, FloatArray]:
        return histogram.batch_windows(gaps, offsets, self.params)


@dataclass(frozen=True)
class PlannedPrewarm:
    """Knative's defaults, with the prewarm planner raising `min-scale` (and pre-pulling images
    unless `pull` is off) each minute: cluster mode drives it through `simulator.prewarming`."""

    pull: bool = True

    @property
    def name(self) -> str:
        return "prewarm" if self.pull else "prewarm:nopull"

    def windows(self, gaps: FloatArray, offsets: IntArray) -> tuple[FloatArray, FloatArray]:
        return KnativeDefault().windows(gaps, offsets)


NAMED = ("knative", "fixed:10", "fixed:20", "hybrid", "prewarm", "prewarm:nopull")


def by_name(name: str) -> KeepAlivePolicy:
    """`knative`, `fixed:MINUTES` (`fixed:10`, `fixed:20`, ...), `hybrid`, `prewarm` or
    `prewarm:nopull`."""
    if name == "knative":
        return KnativeDefault()
    if name == "hybrid":
        return HybridHistogramPolicy()
    if name in ("prewarm", "prewarm:nopull"):
        return PlannedPrewarm(pull=name == "prewarm")
    if name.startswith("fixed:"):
        try:
            minutes = float(name.removeprefix("fixed:"))
        except ValueError:
            minutes = -1.0
        if minutes > 0:
            return FixedKeepAlive(minutes)
        raise KeyError(f"keep-alive {name!r}: fixed:MINUTES needs a positive number of minutes")
    raise KeyError(
        f"unknown keep-alive policy {name!r}; known: knative, fixed:MINUTES, hybrid, prewarm, prewarm:nopull"
    )
