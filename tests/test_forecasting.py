"""The forecaster: the Forecast contract, model choice by backtest, calibrated probabilities."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from forecaster import forecasting
from forecaster.forecasting import CALIBRATION_EDGES, SHORT_STEPS, Forecaster, probability
from forecaster.history import MinuteCounts, idle_minutes
from plugin.forecasts import ForecastLoop

END = 10_000  # minutes since the epoch: any fixed "now"


@pytest.fixture(scope="module")
def forecaster() -> Forecaster:
    rng = np.random.default_rng(4)
    counts = MinuteCounts()
    for minute in range(END - 720, END):
        if minute % 60 == 7:  # hourly job: busy? no, sparse but seasonal
            counts.add("ns/hourly", minute, 5)
        counts.add(
            "ns/busy", minute, int(20 + 10 * np.sin(minute / 60 * 2 * np.pi)) + int(rng.integers(0, 3))
        )
        if rng.random() < 0.03:
            counts.add("ns/rare", minute, 1)
    model = Forecaster(counts)
    model.choose(END)
    return model


def test_classes(forecaster: Forecaster) -> None:
    classes = forecaster.classes(END)
    assert set(classes["busy"]) == {"ns/busy"}
    assert set(classes["sparse"]) == {"ns/hourly", "ns/rare"}


def test_forecast_contract(forecaster: Forecaster) -> None:
    forecasts = forecaster.forecast(END, horizon=30)
    assert set(forecasts) == {"ns/hourly", "ns/busy", "ns/rare"}
    for function, f in forecasts.items():
        assert f.function == function and f.start_minute == END
        assert f.expected.shape == f.p_invoked.shape == (30,)
        assert (f.expected >= 0).all() and ((f.p_invoked >= 0) & (f.p_invoked <= 1)).all()
        assert f.p_within.shape == (30,) and (np.diff(f.p_within) >= 0).all() and f.p_within[-1] <= 1
        assert f.prewarm_minutes >= 0 and f.keepalive_minutes > 0
        assert f.model in forecaster.choice.model.values()
    again = forecaster.forecast(END, horizon=30)
    np.testing.assert_array_equal(again["ns/busy"].expected, forecasts["ns/busy"].expected)  # pure


def test_the_busy_seasonal_function_beats_persistence(forecaster: Forecaster) -> None:
    assert forecaster.choice.model["ns/busy"] != "Naive"
    assert forecaster.choice.relative_mae["ns/busy"] < 1.0


def test_busy_functions_are_almost_surely_invoked(forecaster: Forecaster) -> None:
    assert forecaster.forecast(END, horizon=5)["ns/busy"].p_invoked.min() > 0.9


def test_rare_functions_get_low_probabilities(forecaster: Forecaster) -> None:
    assert forecaster.forecast(END, horizon=5)["ns/rare"].p_invoked.max() < 0.3


def test_calibration_is_monotone_and_bounded(forecaster: Forecaster) -> None:
    tables = [
        *forecaster.choice.calibration.values(),
        *(r for t in forecaster.choice.within.values() for r in t),
    ]
    for table in tables:
        assert table.shape == (len(CALIBRATION_EDGES) - 1,)
        assert (np.diff(table) >= 0).all() and ((table >= 0) & (table <= 1)).all()


def test_probability_without_a_backtest_is_poisson() -> None:
    np.testing.assert_allclose(probability(np.array([0.0, 1.0]), None), [0.0, 1 - np.exp(-1)])


def test_a_function_never_seen_has_no_forecast(forecaster: Forecaster) -> None:
    assert "ns/unknown" not in forecaster.forecast(END, horizon=3)


def test_forecasts_carry_the_hybrid_windows_after_the_observed_idle_times(forecaster: Forecaster) -> None:
    hourly = forecaster.forecast(END, horizon=5)["ns/hourly"]  # idle 60 minutes, always
    assert (hourly.prewarm_minutes, hourly.keepalive_minutes) == pytest.approx((60 * 0.9, 61 * 1.1))


def test_the_first_minutes_follow_their_own_model(forecaster: Forecaster) -> None:
    """A function's first SHORT_STEPS minutes come from the short-horizon pick, the rest from
    the other: here persistence first, then last hour's counts."""
    history = forecaster.counts.series("ns/busy", END, 60)
    choice = forecaster.choice
    picked = choice.short_model["ns/busy"], choice.model["ns/busy"]
    choice.short_model["ns/busy"], choice.model["ns/busy"] = "Naive", "SeasonalNaive60"
    try:
        f = forecaster.forecast(END, horizon=30)["ns/busy"]
    finally:  # the module's other tests see the backtest's own picks
        choice.short_model["ns/busy"], choice.model["ns/busy"] = picked
    assert (f.short_model, f.model) == ("Naive", "SeasonalNaive60")
    np.testing.assert_array_equal(f.expected[:SHORT_STEPS], np.full(SHORT_STEPS, history[-1]))
    np.testing.assert_array_equal(f.expected[SHORT_STEPS:], history[SHORT_STEPS:30])
    assert f.as_json()["short_model"] == "Naive"


def test_the_choice_records_both_picks(forecaster: Forecaster) -> None:
    choice = forecaster.choice
    assert set(choice.short_model) == set(choice.model) == {"ns/hourly", "ns/busy", "ns/rare"}
    assert all(choice.models(f, "busy") == (choice.short_model[f], choice.model[f]) for f in choice.model)
    assert choice.models("ns/unknown", "sparse") == ("CrostonSBA", "CrostonSBA")


def test_the_cycle_pools_idle_times_as_the_idle_answers_do(forecaster: Forecaster) -> None:
    """The cycle pools every chunk's ended and running idle periods before it forecasts any;
    over one chunk of every function that is the pool `idle_answers` makes of its own."""
    histories = forecaster.histories(END)
    gaps = {f: idle_minutes(series) for f, series in histories.items()}
    own = forecasting.idle_answers(histories, gaps, 30)
    for function, forecast in forecaster.forecast(END, horizon=30).items():
        assert forecast.p_within_idle is not None and own[function][0] is not None
        np.testing.assert_array_equal(forecast.p_within_idle, own[function][0])


def test_chunks_change_nothing_and_a_stop_ends_the_cycle_at_the_next_one(
    forecaster: Forecaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunking bounds a cycle's memory; it must not change a forecast (pooled idle times,
    calibration and choices are over every function, whatever the chunk)."""
    whole_choice, whole = forecaster.choice, forecaster.forecast(END, horizon=30)
    chunked = Forecaster(forecaster.counts)
    monkeypatch.setattr(forecasting, "CHUNK_FUNCTIONS", 1)
    choice = chunked.choose(END)
    assert (choice.model, choice.short_model) == (whole_choice.model, whole_choice.short_model)
    for kind, table in whole_choice.within.items():
        assert np.array_equal(choice.within[kind], table)
        assert np.array_equal(choice.calibration[kind], whole_choice.calibration[kind])
    again = chunked.forecast(END, horizon=30)
    assert {f: v.as_json() for f, v in again.items()} == {f: v.as_json() for f, v in whole.items()}

    read: list[object] = []
    reading = chunked.histories

    def histories(end: int, functions: object = None) -> dict[str, np.ndarray]:
        read.append(functions)
        chunked.stop.set()  # as a shutdown would, while the first chunk is being forecast
        return reading(end, functions)  # type: ignore[arg-type]

    monkeypatch.setattr(chunked, "histories", histories)
    with pytest.raises(forecasting.Stopped):
        chunked.forecast(END, horizon=30)
    assert len(read) == 1  # one chunk of three, then it gave up


async def test_a_cancelled_forecast_loop_frees_its_worker_thread_at_the_next_chunk(
    forecaster: Forecaster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGTERM cancels the loop's task; the cycle's thread must not run on for a whole cycle
    (minutes at the function cap) while the process waits to exit."""
    monkeypatch.setattr(forecasting, "CHUNK_FUNCTIONS", 1)
    model = Forecaster(forecaster.counts)
    model.choice = forecaster.choice
    started, chunks = threading.Event(), []
    reading = model.histories

    def histories(end: int, functions: object = None) -> dict[str, np.ndarray]:
        started.set()
        chunks.append(functions)
        time.sleep(0.3)  # a chunk's worth of work
        return reading(end, functions)  # type: ignore[arg-type]

    monkeypatch.setattr(model, "histories", histories)
    loop = ForecastLoop(forecaster=model, clock=lambda: END * 60.0, rechoose_s=float("inf"))
    task = asyncio.create_task(loop.run())
    await asyncio.to_thread(started.wait, 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(1.0)  # the thread finishes the chunk it is in, then gives up
    assert model.stop.is_set() and len(chunks) <= 2  # of the 6 a cycle reads
