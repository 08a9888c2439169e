"""The KPA model, scenario by scenario, with time moved explicitly (one call per second)."""

from __future__ import annotations

import itertools

import numpy as np

from simulator.knative import Autoscaler, AutoscalerConfig


class Revision:
    """One revision with target 10 (capacity 7 at 70 %), driven second by second."""

    def __init__(self, min_scale: int = 0) -> None:
        self.kpa = Autoscaler(np.array([10.0]), AutoscalerConfig())
        self.now, self.pods, self.min_scale = 0, 0, min_scale

    def run(self, seconds: int, concurrency: float) -> list[int]:
        seen = []
        for _ in range(seconds):
            self.kpa.observe(np.array([concurrency]))
            if self.now % 2 == 0:
                want = self.kpa.desired(
                    float(self.now), np.array([self.pods]), np.array([self.pods]), np.array([self.min_scale])
                )
                self.pods = int(want[0])
            seen.append(self.pods)
            self.now += 1
        return seen


def test_steady_concurrency_gives_ceil_of_concurrency_over_capacity() -> None:
    revision = Revision()
    assert revision.run(120, 14.0)[-1] == 2
    assert Revision().run(120, 15.0)[-1] == 3


def test_scale_to_zero_waits_for_the_stable_window_and_the_grace_period() -> None:
    revision = Revision()
    revision.run(120, 5.0)
    after = revision.run(120, 0.0)
    assert after[55] == 1  # the stable window still remembers traffic
    first_zero = after.index(0)
    assert 60 + 30 - 2 <= first_zero <= 60 + 30 + 2  # stable window, then the grace period


def test_min_scale_is_honoured_without_traffic() -> None:
    assert Revision(min_scale=2).run(200, 0.0)[-1] == 2


def test_panic_scales_on_the_short_window() -> None:
    revision = Revision()
    revision.run(120, 7.0)
    assert revision.pods == 1
    burst = revision.run(8, 140.0)
    # stable average after 8 s of 140: (52 x 7 + 8 x 140) / 60 = 24.7 -> 4 pods; panic sees 20
    assert burst[-1] == 20


def test_scale_down_at_most_halves_per_tick() -> None:
    revision = Revision()
    revision.run(120, 56.0)
    assert revision.pods == 8
    after = revision.run(200, 0.0)
    drops = [b / a for a, b in itertools.pairwise(after) if b < a and b > 0]
    assert all(ratio >= 0.5 for ratio in drops)
