"""Keep-alive study mode: cold starts and wasted time of one instance per function, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from simulator import keepalive, study


def outcome(minutes: dict[int, int], policy: keepalive.KeepAlivePolicy, length: int = 100) -> study.Outcome:
    counts = np.zeros((1, length), dtype=np.int64)
    for minute, count in minutes.items():
        counts[0, minute] = count
    return study.run(study.IdlePeriods.from_counts(counts), policy)


def test_fixed_keepalive_by_hand() -> None:
    # invocations at minutes 0 (x3), 5, 30; keep alive 10 minutes; trace of 100 minutes
    result = outcome({0: 3, 5: 1, 30: 1}, keepalive.FixedKeepAlive(10))
    assert result.invocations[0] == 5
    assert result.cold_starts[0] == 2  # minute 0 (first) and minute 30 (25 > 10 idle)
    assert result.wasted_minutes[0] == pytest.approx(5 + 10 + 10)  # idle 5, then 10 twice
    assert result.cold_start_pct[0] == pytest.approx(40.0)


def test_knative_default_unloads_after_ninety_seconds() -> None:
    result = outcome({0: 1, 1: 1, 3: 1}, keepalive.KnativeDefault())
    assert result.cold_starts[0] == 2  # 1 minute idle is warm, 2 minutes is not
    assert result.wasted_minutes[0] == pytest.approx(1 + 1.5 + 1.5)


def test_prewarm_window_by_hand() -> None:
    class Windows:
        name = "test"

        def windows(self, gaps: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return np.full(gaps.size, 20.0), np.full(gaps.size, 10.0)

    # gaps: 25 (inside 20..30: warm, loaded 5), 10 (before pre-warm: cold, loaded 0), tail 45 (loaded 10)
    result = outcome({0: 1, 25: 1, 35: 1}, Windows(), length=80)
    assert result.cold_starts[0] == 2
    assert result.wasted_minutes[0] == pytest.approx(5 + 0 + 10)


def test_unused_functions_cost_nothing() -> None:
    result = outcome({}, keepalive.FixedKeepAlive(10))
    assert (result.invocations[0], result.cold_starts[0], result.wasted_minutes[0]) == (0, 0, 0.0)


def test_longer_keepalive_trades_memory_for_cold_starts() -> None:
    rng = np.random.default_rng(0)
    counts = (rng.random((50, 600)) < 0.05).astype(np.int64)
    periods = study.IdlePeriods.from_counts(counts)
    short, long = (
        study.run(periods, keepalive.FixedKeepAlive(5)),
        study.run(periods, keepalive.FixedKeepAlive(60)),
    )
    assert long.cold_starts.sum() < short.cold_starts.sum()
    assert long.wasted_minutes.sum() > short.wasted_minutes.sum()


@pytest.mark.parametrize("name", ["knative", "fixed:10", "fixed:2.5", "hybrid"])
def test_policies_by_name(name: str) -> None:
    assert keepalive.by_name(name).name == name


@pytest.mark.parametrize("name", ["fixed:", "fixed:-1", "forever"])
def test_bad_policy_names(name: str) -> None:
    with pytest.raises(KeyError):
        keepalive.by_name(name)
