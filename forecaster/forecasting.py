"""Per-function invocation forecasts: statsforecast models, chosen per function by backtest.

Functions fall in two classes by how many of their recent minutes saw an invocation:
*sparse* ones get the intermittent-demand models (CrostonSBA, ADIDA, IMAPA, TSB), *busy* ones
the seasonal models (SeasonalNaive at 60 and 1,440 minutes when history allows, AutoETS), and
both have Naive (persistence), also the fallback of a series a model fails on. One
`StatsForecast` call serves all functions of a class. `choose` runs a rolling-origin backtest
(`cross_validation`) and keeps, per function, the model with the lowest MAE, that MAE relative
to persistence's, and a calibration from expected count to the observed frequency of at least one
invocation in a minute (intermittent models give no intervals; this is the empirical
answer). `forecast(now, horizon)` is pure given the history and the last choice.
The hybrid histogram windows (`histogram`) ride along in every `Forecast`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pandas as pd
from statsforecast import StatsForecast
from statsforecast.models import ADIDA, IMAPA, TSB, AutoETS, CrostonSBA, Naive, SeasonalNaive

from forecaster import histogram
from forecaster.history import MinuteCounts, idle_minutes

logger = logging.getLogger(__name__)
FloatArray = npt.NDArray[np.float64]

BUSY_SHARE = 0.5  # functions invoked in at least half of their recent minutes are "busy"
TRAINING_MINUTES = 720  # the window each fit sees: 12 hours of minute counts
BACKTEST_WINDOWS = 4  # rolling origins of the model-choice backtest
CALIBRATION_EDGES = np.array([0.0, 0.005, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, np.inf])


@dataclass(frozen=True)
class Forecast:
    """What the planner needs to know of one function's next minutes."""

    function: str
    start_minute: int  # the first forecast minute
    expected: FloatArray  # expected invocations per future minute
    p_invoked: FloatArray  # probability of at least one invocation per future minute
    prewarm_minutes: float  # hybrid histogram windows after the last invocation
    keepalive_minutes: float
    model: str
    relative_mae: float | None  # backtest MAE of the chosen model / that of persistence (< 1 beats it)

    def as_json(self) -> dict[str, object]:
        return {
            "start_minute": self.start_minute,
            "expected": [round(float(v), 4) for v in self.expected],
            "p_invoked": [round(float(v), 4) for v in self.p_invoked],
            "prewarm_minutes": round(self.prewarm_minutes, 3),
            "keepalive_minutes": round(self.keepalive_minutes, 3),
            "model": self.model,
            "relative_mae": None if self.relative_mae is None else round(self.relative_mae, 4),
        }


@dataclass
class Choice:
    """The outcome of the last backtest: a model per function, errors, the calibration."""

    model: dict[str, str] = field(default_factory=dict)
    relative_mae: dict[str, float] = field(default_factory=dict)
    calibration: dict[str, FloatArray] = field(default_factory=dict)  # class -> P(>=1) per edge bin


def models_for(kind: str, minutes: int) -> list[object]:
    """The candidate models of a class, given how many minutes of history there are."""
    if kind == "sparse":
        return [CrostonSBA(), ADIDA(), IMAPA(), TSB(alpha_d=0.2, alpha_p=0.2), Naive()]
    seasonal: list[object] = [SeasonalNaive(season_length=60, alias="SeasonalNaive60")]
    if minutes >= 2 * 1440:
        seasonal.append(SeasonalNaive(season_length=1440, alias="SeasonalNaive1440"))
    return [*seasonal, AutoETS(season_length=60 if minutes >= 180 else 1), Naive()]


class Forecaster:
    """Forecasts every function the history knows."""

    def __init__(self, counts: MinuteCounts, *, training_minutes: int = TRAINING_MINUTES) -> None:
        self.counts = counts
        self.training_minutes = training_minutes
        self.choice = Choice()

    def classes(self, end_minute: int) -> dict[str, list[str]]:
        """Functions by class, from the share of recent minutes with an invocation."""
        out: dict[str, list[str]] = {"sparse": [], "busy": []}
        for function in self.counts.functions:
            series = self.counts.series(function, end_minute, self.training_minutes)
            share = float(np.count_nonzero(series)) / len(series)
            out["busy" if share >= BUSY_SHARE else "sparse"].append(function)
        return out

    def choose(self, end_minute: int, *, horizon: int = 30) -> Choice:
        """Backtest every candidate model over the last windows; keep the best per function."""
        choice = Choice()
        for kind, functions in self.classes(end_minute).items():
            if not functions:
                continue
            frame = self._frame(functions, end_minute)
            engine = StatsForecast(
                models=models_for(kind, self.training_minutes), freq=1, n_jobs=1, fallback_model=Naive()
            )
            backtest = engine.cross_validation(
                df=frame, h=horizon, step_size=horizon, n_windows=BACKTEST_WINDOWS
            )
            names = [c for c in backtest.columns if c not in ("unique_id", "ds", "cutoff", "y")]
            errors = backtest.assign(**{n: (backtest[n] - backtest["y"]).abs() for n in names})
            mae = errors.groupby("unique_id")[names].mean()
            best = mae.idxmin(axis=1)
            persistence = mae["Naive"].replace(0.0, np.nan)
            for function in functions:
                model = str(best.get(function, "Naive"))
                choice.model[function] = model
                ratio = float(mae.at[function, model] / persistence.get(function, np.nan))
                if np.isfinite(ratio):
                    choice.relative_mae[function] = ratio
            chosen = _chosen_column(backtest, best)
            choice.calibration[kind] = _calibrate(chosen["chosen"].to_numpy(), chosen["y"].to_numpy())
        self.choice = choice
        return choice

    def forecast(self, end_minute: int, horizon: int = 30) -> dict[str, Forecast]:
        """Forecasts for minutes [end_minute, end_minute + horizon) of every function."""
        out: dict[str, Forecast] = {}
        for kind, functions in self.classes(end_minute).items():
            if not functions:
                continue
            frame = self._frame(functions, end_minute)
            engine = StatsForecast(
                models=models_for(kind, self.training_minutes), freq=1, n_jobs=1, fallback_model=Naive()
            )
            predicted = engine.forecast(df=frame, h=horizon)
            calibration = self.choice.calibration.get(kind)
            for function, rows in predicted.groupby("unique_id", sort=False):
                model = self.choice.model.get(str(function), "Naive")
                if model not in rows:
                    model = "Naive"
                expected = np.clip(rows[model].to_numpy(dtype=np.float64), 0.0, None)
                out[str(function)] = self._assemble(str(function), end_minute, expected, model, calibration)
        return out

    def _assemble(
        self, function: str, end_minute: int, expected: FloatArray, model: str, calibration: FloatArray | None
    ) -> Forecast:
        series = self.counts.series(function, end_minute, self.training_minutes)
        state = histogram.HybridHistogram()
        for idle in idle_minutes(series):
            state.observe(idle)
        windows = state.windows()
        return Forecast(
            function=function,
            start_minute=end_minute,
            expected=expected,
            p_invoked=probability(expected, calibration),
            prewarm_minutes=windows.prewarm_minutes,
            keepalive_minutes=windows.keepalive_minutes,
            model=model,
            relative_mae=self.choice.relative_mae.get(function),
        )

    def _frame(self, functions: Sequence[str], end_minute: int) -> pd.DataFrame:
        length = self.training_minutes
        values = np.concatenate([self.counts.series(f, end_minute, length) for f in functions]).astype(
            np.float64
        )
        return pd.DataFrame(
            {
                "unique_id": np.repeat(np.asarray(functions, dtype=object), length),
                "ds": np.tile(np.arange(end_minute - length, end_minute), len(functions)),
                "y": values,
            }
        )


def _chosen_column(backtest: pd.DataFrame, best: pd.Series) -> pd.DataFrame:
    """The backtest forecast of each row's chosen model, as column `chosen`."""
    picked = np.empty(len(backtest))
    for model in best.unique():
        rows = backtest["unique_id"].map(best).to_numpy() == model
        picked[rows] = backtest.loc[rows, model].to_numpy()
    return backtest.assign(chosen=picked)


def _calibrate(expected: FloatArray, observed: FloatArray) -> FloatArray:
    """Observed share of minutes with >= 1 invocation per bin of expected count (monotone)."""
    bins = np.clip(
        np.searchsorted(CALIBRATION_EDGES, expected, side="right") - 1, 0, len(CALIBRATION_EDGES) - 2
    )
    hits = np.bincount(bins, weights=(observed > 0).astype(float), minlength=len(CALIBRATION_EDGES) - 1)
    totals = np.bincount(bins, minlength=len(CALIBRATION_EDGES) - 1)
    prior = 1.0 - np.exp(-_bin_centres())  # Poisson, where a bin saw no backtest minute
    share = np.where(totals > 0, (hits + prior) / (totals + 1.0), prior)
    return np.maximum.accumulate(share)  # more expected invocations never mean fewer


def _bin_centres() -> FloatArray:
    upper = np.where(np.isfinite(CALIBRATION_EDGES[1:]), CALIBRATION_EDGES[1:], CALIBRATION_EDGES[-2] * 2)
    return (CALIBRATION_EDGES[:-1] + upper) / 2


def probability(expected: FloatArray, calibration: FloatArray | None) -> FloatArray:
    """P(>= 1 invocation) per minute: calibrated when a backtest ran, else Poisson."""
    if calibration is None:
        return 1.0 - np.exp(-np.clip(expected, 0.0, None))
    bins = np.clip(
        np.searchsorted(CALIBRATION_EDGES, expected, side="right") - 1, 0, len(CALIBRATION_EDGES) - 2
    )
    return calibration[bins]


def by_class(forecasts: Mapping[str, Forecast]) -> dict[str, int]:
    """How many functions each chosen model serves (for logs and spans)."""
    tally: dict[str, int] = {}
    for f in forecasts.values():
        tally[f.model] = tally.get(f.model, 0) + 1
    return tally
