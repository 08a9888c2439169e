"""Knative's KPA, vectorised over revisions: concurrency windows in, desired pods out.

Per revision, observed concurrency is sampled every second into a 60-s ring. Every 2-s tick:
stable average over the stable window, panic average over the panic window (10 % of it);
desired = ceil(average / (target x target utilization)). Panic starts when the panic average
reaches twice the ready capacity, holds for a stable window, and never scales down meanwhile.
Scale-down is limited to halving per tick (max-scale-down-rate 2), which keeps at least one
pod until the stable average reaches 0; the revision then goes to zero once that has lasted
the scale-to-zero grace period. `min-scale` is honoured.
Defaults are `config-autoscaler`'s (protocols.md §3.4; knative/serving pkg/autoscaler).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class AutoscalerConfig:
    stable_window_s: int = 60
    panic_window_percentage: float = 10.0
    panic_threshold: float = 2.0  # panic-threshold-percentage 200 %
    scale_to_zero_grace_s: float = 30.0
    max_scale_down_rate: float = 2.0
    target_utilization: float = 0.70
    tick_s: int = 2  # the autoscaler's evaluation period

    @property
    def panic_window_s(self) -> int:
        return max(1, round(self.stable_window_s * self.panic_window_percentage / 100.0))


class Autoscaler:
    """The KPA state of many revisions; `observe` each second, `desired` each tick."""

    def __init__(self, targets: FloatArray, config: AutoscalerConfig) -> None:
        self.config = config
        self._capacity = targets * config.target_utilization  # concurrency one pod should carry
        self._targets = targets
        n = targets.size
        self._samples = np.zeros((config.stable_window_s, n))
        self._stable_sum = np.zeros(n)
        self._panic_sum = np.zeros(n)
        self._second = 0
        self._panic_until = np.full(n, -1.0)
        self._zero_since = np.full(n, np.inf)

    def observe(self, concurrency: FloatArray) -> None:
        """Record this second's concurrency of every revision."""
        window, panic = self.config.stable_window_s, self.config.panic_window_s
        slot = self._second % window
        self._stable_sum += concurrency - self._samples[slot]
        leaving = self._samples[(self._second - panic) % window] if self._second >= panic else 0.0
        self._panic_sum += concurrency - leaving
        self._samples[slot] = concurrency
        self._second += 1

    def desired(self, now: float, ready: IntArray, current: IntArray, min_scale: IntArray) -> IntArray:
        """Pods each revision should have now (`current` counts ready and starting pods)."""
        config = self.config
        stable = np.maximum(self._stable_sum, 0.0) / config.stable_window_s
        panic = np.maximum(self._panic_sum, 0.0) / config.panic_window_s
        want_stable = np.ceil(np.round(stable / self._capacity, 9)).astype(np.int64)
        want_panic = np.ceil(np.round(panic / self._capacity, 9)).astype(np.int64)
        panicking = panic >= config.panic_threshold * np.maximum(ready, 1) * self._targets
        self._panic_until = np.where(panicking, now + config.stable_window_s, self._panic_until)
        in_panic = self._panic_until > now
        want = np.where(in_panic, np.maximum(np.maximum(want_panic, want_stable), current), want_stable)
        floor = np.ceil(current / config.max_scale_down_rate).astype(np.int64)
        want = np.where(want < current, np.maximum(want, floor), want)
        want = np.maximum(want, min_scale)
        zero = (want_stable == 0) & (min_scale == 0) & ~in_panic
        self._zero_since = np.where(zero, np.minimum(self._zero_since, now), np.inf)
        expired = zero & (now - self._zero_since >= config.scale_to_zero_grace_s)
        return np.where(expired, 0, want)

    def poke(self, revisions: IntArray) -> None:
        """A request reached a revision with no pods (the activator's poke): no grace to wait out."""
        self._zero_since[revisions] = np.inf
