"""Forecasts on Ray (`KDRL_FORECAST_ENGINE=ray`): a local Ray of 2 CPUs, as in CI."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray

from forecaster import forecasting
from forecaster.forecasting import Forecaster, LocalEngine
from forecaster.history import MinuteCounts
from plugin import app, settings
from plugin.errors import SettingsError
from plugin.forecasts import ForecastLoop
from plugin.ray_engine import RayEngine
from tests.conftest import metric

END = 40_000_000


@pytest.fixture(scope="module")
def counts() -> MinuteCounts:
    rng = np.random.default_rng(8)
    history = MinuteCounts()
    for i in range(45):
        rate = rng.lognormal(-1.5, 1.5)
        for minute in np.flatnonzero(rng.poisson(rate, size=720)):
            history.add(f"ns/f{i:02d}", END - 720 + int(minute), 1 + int(rng.integers(0, 4)))
    return history


def as_json(forecasts: dict[str, forecasting.Forecast]) -> dict[str, Any]:
    return {function: forecast.as_json() for function, forecast in forecasts.items()}


def test_an_unreachable_cluster_falls_back_to_local_for_the_cycle(
    counts: MinuteCounts, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # whatever other tests started
    loop = ForecastLoop(
        forecaster=Forecaster(counts, engine=RayEngine("127.0.0.1:1")), clock=lambda: (END - 1) * 60.0
    )
    before = metric("kdrl.forecast.fallbacks", kdrl_engine="RayEngine")
    fresh = loop.cycle(choose=True)
    local = Forecaster(counts)
    local.choose(END)
    assert as_json(fresh) == as_json(local.forecast(END))  # fresh forecasts, not stale ones
    assert metric("kdrl.forecast.fallbacks", kdrl_engine="RayEngine") == before + 2  # choice, forecast


def test_forecasts_through_ray_equal_the_local_ones(
    counts: MinuteCounts, ray_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forecasting, "CHUNK_FUNCTIONS", 10)  # several chunks in flight at once
    local, remote = Forecaster(counts), Forecaster(counts, engine=RayEngine(ray_address, in_flight=2))
    chosen, chosen_remotely = local.choose(END), remote.choose(END)
    assert (chosen.model, chosen.short_model) == (chosen_remotely.model, chosen_remotely.short_model)
    for kind, table in chosen.calibration.items():
        assert np.array_equal(table, chosen_remotely.calibration[kind])
        assert np.array_equal(chosen.within[kind], chosen_remotely.within[kind])
    assert as_json(local.forecast(END)) == as_json(remote.forecast(END))


class DyingWorkers(RayEngine):
    """Every task's worker exits mid-task, as a node lost mid-cycle would take them."""

    def map(self, work: Callable[[Any], Any], tasks: Iterable[Any]) -> Iterator[Any]:
        def die(task: Any) -> Any:  # nested: Ray ships it by value
            os._exit(1)

        return super().map(die, tasks)


def test_a_ray_version_mismatch_names_both_versions(ray_address: str) -> None:
    """A driver of another Ray version than the cluster's (patched here: the cluster is this
    process's) stops with one line naming both, not Ray's traceback."""
    code = (
        "import ray; ray.__version__ = '2.0.0'\n"
        "from plugin.ray_engine import connect\n"
        f"try: connect({ray_address!r})\n"
        "except ConnectionError as e: print(e)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    line = done.stdout.strip()
    assert "Version mismatch" in line and "Ray: 2.0.0" in line and f"Ray: {ray.__version__}" in line
    assert "Install the cluster's Ray and Python versions" in line


def test_a_worker_lost_mid_cycle_falls_back_to_local(counts: MinuteCounts, ray_address: str) -> None:
    loop = ForecastLoop(
        forecaster=Forecaster(counts, engine=DyingWorkers(ray_address)), clock=lambda: (END - 1) * 60.0
    )
    before = metric("kdrl.forecast.fallbacks", kdrl_engine="DyingWorkers")
    fresh = loop.cycle(choose=False)
    assert as_json(fresh) == as_json(Forecaster(counts).forecast(END))
    assert metric("kdrl.forecast.fallbacks", kdrl_engine="DyingWorkers") == before + 1


@pytest.mark.parametrize(
    ("environment", "problem"),
    [
        ({"KDRL_FORECAST_ENGINE": "ray"}, "needs KDRL_RAY_ADDRESS"),
        ({"KDRL_FORECAST_ENGINE": "ray", "KDRL_RAY_ADDRESS": "nowhere"}, "HOST:PORT"),
        ({"KDRL_FORECAST_ENGINE": "spark"}, "KDRL_FORECAST_ENGINE"),
    ],
)
async def test_ray_settings_are_checked_at_start(
    tmp_path: Path, environment: dict[str, str], problem: str
) -> None:
    environment = {
        **environment,
        "KDRL_NODES_FILE": str(Path(__file__).parent.parent / "examples" / "cluster" / "nodes.json"),
        "KDRL_HISTORY_PATH": str(tmp_path / "h.db"),
    }
    with pytest.raises(SettingsError, match=problem):
        await app.create_app(settings.load({}, environment))


async def test_the_ray_engine_without_ray_installed_is_refused_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *args: None if name == "ray" else real(name, *args)
    )
    environment = {
        "KDRL_FORECAST_ENGINE": "ray",
        "KDRL_RAY_ADDRESS": "ray://head:10001",
        "KDRL_NODES_FILE": str(Path(__file__).parent.parent / "examples" / "cluster" / "nodes.json"),
        "KDRL_HISTORY_PATH": str(tmp_path / "h.db"),
    }
    with pytest.raises(SettingsError, match="needs Ray"):
        await app.create_app(settings.load({}, environment))


def test_the_local_engine_is_the_default(counts: MinuteCounts) -> None:
    assert isinstance(Forecaster(counts).engine, LocalEngine)
