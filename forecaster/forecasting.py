"""Per-function invocation forecasts: statsforecast models, chosen per function by backtest.

Functions fall in two classes by how many of their recent minutes saw an invocation:
*sparse* ones get the intermittent-demand models (CrostonSBA, ADIDA, IMAPA, TSB), *busy* ones
the seasonal models (SeasonalNaive at 60 and 1,440 minutes when history allows, AutoETS), and
both have Naive (persistence), also the fallback of a series a model fails on. One
`StatsForecast` call serves all functions of a class. `choose` runs a rolling-origin backtest
(`cross_validation`) and keeps, per function, the model with the lowest MAE (one for the first
minutes, one for the rest of the horizon), that MAE relative
to persistence's, and a calibration from expected count to the observed frequency of at least one
invocation in a minute (intermittent models give no intervals; this is the empirical
answer). `forecast(now, horizon)` is pure given the history and the last choice.
The hybrid histogram windows (`histogram`) ride along in every `Forecast`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, TypeVar

import numpy as np
import numpy.typing as npt
import pandas as pd
from statsforecast import StatsForecast
from statsforecast.models import ADIDA, IMAPA, TSB, AutoETS, CrostonSBA, Naive, SeasonalNaive

from forecaster import histogram, idletimes, phase
from forecaster.history import MinuteCounts, idle_minutes

logger = logging.getLogger(__name__)
FloatArray = npt.NDArray[np.float64]

BUSY_SHARE = 0.5  # functions invoked in at least half of their recent minutes are "busy"
TRAINING_MINUTES = 720  # the window each fit sees: 12 hours of minute counts
BACKTEST_WINDOWS = 4  # rolling origins of the model-choice backtest
BACKTEST_STEP = 30  # minutes between them
SWITCH_MARGIN = 0.05  # a model replaces persistence only with a backtest MAE 5 % lower
# The first minutes get their own choice: persistence is hard to beat a minute ahead and
# easy to beat half an hour ahead, so one model for the whole horizon is wrong at one end.
SHORT_STEPS = 5
CALIBRATION_EDGES = np.array([0.0, 0.005, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, np.inf])


@dataclass(frozen=True)
class Forecast:
    """What the planner needs to know of one function's next minutes."""

    function: str
    start_minute: int  # the first forecast minute
    expected: FloatArray  # expected invocations per future minute
    p_invoked: FloatArray  # probability of at least one invocation per future minute
    p_within: FloatArray  # probability of at least one invocation within the first k minutes
    prewarm_minutes: float  # hybrid histogram windows after the last invocation
    keepalive_minutes: float
    model: str  # for minutes after the first SHORT_STEPS
    relative_mae: float | None  # backtest MAE of the chosen models / that of persistence (< 1 beats it)
    # P(next invocation within the first k minutes) from the function's own idle times since its
    # last invocation (`idletimes`); None where they say too little.
    p_within_idle: FloatArray | None = None
    short_model: str | None = None  # for the first SHORT_STEPS minutes; None: `model`
    pattern: idletimes.Pattern = idletimes.Pattern.NEW  # what its idle times look like
    elapsed_minutes: int | None = None  # since its last invocation minute, at start_minute (1: just before)
    # The same from the same minutes of the last hours (`phase`); None where it has none.
    p_within_phase: FloatArray | None = None
    phase_chosen: bool = False  # whether `phase.Scores` found it the better of the two lately

    @property
    def hybrid_holds(self) -> bool:
        """Whether the hybrid histogram would hold an instance loaded in the first minute."""
        elapsed = self.elapsed_minutes
        return elapsed is not None and self.prewarm_minutes < elapsed + 1 <= (
            self.prewarm_minutes + self.keepalive_minutes + 1
        )

    def later(
        self,
        minutes: int,
        p_within_idle: FloatArray | None = None,
        pattern: idletimes.Pattern | None = None,
        elapsed_minutes: int | None = None,
        p_within_phase: FloatArray | None = None,
    ) -> Forecast:
        """This forecast `minutes` on (the first minutes dropped), with the idle-time and phase
        answers, class and idle time for that moment; `p_within` over what is left assumes the
        minutes independent."""
        shift = max(minutes, 0)
        p_invoked = self.p_invoked[shift:]
        p_within = np.asarray(1.0 - np.cumprod(1.0 - p_invoked), dtype=np.float64) if shift else self.p_within
        # One `replace`: the simulator calls this for every function every minute.
        return replace(
            self,
            start_minute=self.start_minute + shift,
            expected=self.expected[shift:],
            p_invoked=p_invoked,
            p_within=p_within,
            p_within_idle=p_within_idle,
            pattern=self.pattern if pattern is None else pattern,
            elapsed_minutes=elapsed_minutes,
            p_within_phase=p_within_phase,
            phase_chosen=False,
        )

    @property
    def answer(self) -> str:
        """Which answer `best_p_within` gives: "phase", "idle" or "model"."""
        if self.phase_chosen and self.p_within_phase is not None:
            return "phase"
        return "model" if self.p_within_idle is None else "idle"

    @property
    def best_p_within(self) -> FloatArray:
        """The phase answer where it has lately been the better one, else the idle-time answer
        when there is one (it knows timing), else the model's (`answer` names which)."""
        chosen = {"phase": self.p_within_phase, "idle": self.p_within_idle}.get(self.answer)
        return self.p_within if chosen is None else chosen

    def as_json(self) -> dict[str, object]:
        return {
            "start_minute": self.start_minute,
            "expected": [round(float(v), 4) for v in self.expected],
            "p_invoked": [round(float(v), 4) for v in self.p_invoked],
            "p_within": [round(float(v), 4) for v in self.p_within],
            "prewarm_minutes": round(self.prewarm_minutes, 3),
            "keepalive_minutes": round(self.keepalive_minutes, 3),
            "model": self.model,
            "short_model": self.short_model or self.model,
            "relative_mae": None if self.relative_mae is None else round(self.relative_mae, 4),
            "pattern": self.pattern.value,
            "elapsed_minutes": self.elapsed_minutes,
            "p_within_idle": _rounded(self.p_within_idle),
            "p_within_phase": _rounded(self.p_within_phase),
        }


def _rounded(values: FloatArray | None) -> list[float] | None:
    return None if values is None else [round(float(v), 4) for v in values]


@dataclass
class Choice:
    """The outcome of the last backtest: a model per function, errors, the calibration."""

    model: dict[str, str] = field(default_factory=dict)  # for minutes after the first SHORT_STEPS
    short_model: dict[str, str] = field(default_factory=dict)  # for the first SHORT_STEPS minutes
    relative_mae: dict[str, float] = field(default_factory=dict)
    calibration: dict[str, FloatArray] = field(default_factory=dict)  # class -> P(>=1) per edge bin
    within: dict[str, FloatArray] = field(default_factory=dict)  # class -> P(any) per k bucket and bin

    def of(self, functions: Iterable[str]) -> Choice:
        """The picks for `functions` only, with every calibration (what one chunk needs)."""
        names = list(functions)
        return Choice(
            model={f: self.model[f] for f in names if f in self.model},
            short_model={f: self.short_model[f] for f in names if f in self.short_model},
            relative_mae={f: self.relative_mae[f] for f in names if f in self.relative_mae},
            calibration=self.calibration,
            within=self.within,
        )

    def models(self, function: str, kind: str) -> tuple[str, str]:
        """(first minutes, the rest): the backtest's picks, or the class default before one."""
        later = self.model.get(function, DEFAULT_MODEL[kind])
        return self.short_model.get(function, later), later


SPARSE_MODELS = ("CrostonSBA", "ADIDA", "IMAPA", "TSB", "Naive")
BUSY_MODELS = ("SeasonalNaive60", "SeasonalNaive1440", "AutoETS", "Naive")
DEFAULT_MODEL = {"sparse": "CrostonSBA", "busy": "SeasonalNaive60"}  # before any backtest
# AutoETS costs ~30 ms a series even without a seasonal component (~500 ms with a 60-minute
# one), so only the busiest functions are backtested with it.
AUTOETS_LIMIT = 200
# Functions per statsforecast call: a cycle's frames and backtests grow with it, not with the
# number of functions (bench.forecaster --rss).
CHUNK_FUNCTIONS = 1000


def model(name: str) -> object:
    """A fresh statsforecast model by our name for it (its alias in result columns)."""
    if name == "CrostonSBA":
        return CrostonSBA()
    if name == "ADIDA":
        return ADIDA()
    if name == "IMAPA":
        return IMAPA()
    if name == "TSB":
        return TSB(alpha_d=0.2, alpha_p=0.2)
    if name == "Naive":
        return Naive()
    if name.startswith("SeasonalNaive"):
        return SeasonalNaive(season_length=int(name.removeprefix("SeasonalNaive")), alias=name)
    if name == "AutoETS":
        return AutoETS(season_length=1, model="ZZN")
    raise KeyError(f"unknown forecasting model {name!r}")


def candidates(kind: str, minutes: int, *, with_ets: bool) -> list[str]:
    """Model names to backtest for a class, given the minutes of history a fit sees."""
    if kind == "sparse":
        return list(SPARSE_MODELS)
    names = [n for n in BUSY_MODELS if n != "SeasonalNaive1440" or minutes >= 2 * 1440]
    return names if with_ets else [n for n in names if n != "AutoETS"]


class Stopped(Exception):
    """A cycle given up between two chunks because its `stop` event was set."""


Histories = dict[str, npt.NDArray[np.int64]]
Task = TypeVar("Task")
Result = TypeVar("Result")


class Engine(Protocol):
    """Where a cycle's chunks run: each `work(task)` is pure, so any engine gives the same
    answer. Results come back in the order of the tasks, lazily, so that a cycle holds only the
    chunks in flight (`tasks` is a generator)."""

    def map(self, work: Callable[[Task], Result], tasks: Iterable[Task]) -> Iterator[Result]: ...


class LocalEngine:
    """In this process, one chunk at a time (the default, and the fallback of any other)."""

    def map(self, work: Callable[[Task], Result], tasks: Iterable[Task]) -> Iterator[Result]:
        return (work(task) for task in tasks)


@dataclass(frozen=True)
class BacktestTask:
    """Model choice for one chunk of one class: histories in, picks and tallies out."""

    histories: Histories
    end_minute: int
    horizon: int
    kind: str
    with_ets: bool
    training_minutes: int


@dataclass(frozen=True)
class Picks:
    kind: str
    model: dict[str, str]
    short_model: dict[str, str]
    relative_mae: dict[str, float]
    tallies: FloatArray  # `_calibration_tallies`: summed over chunks


def backtest(task: BacktestTask) -> Picks:
    """The rolling-origin backtest of one chunk (pure: runs on any engine)."""
    names = candidates(task.kind, task.training_minutes, with_ets=task.with_ets)
    frame = _frame(list(task.histories), task.histories, task.end_minute, task.training_minutes)
    result = _engine(names).cross_validation(
        df=frame, h=task.horizon, step_size=BACKTEST_STEP, n_windows=BACKTEST_WINDOWS
    )
    choice = Choice()
    tallies = _calibration_tallies(_pick(result, names, choice))
    return Picks(task.kind, choice.model, choice.short_model, choice.relative_mae, tallies)


@dataclass(frozen=True)
class ForecastTask:
    """Forecasts for one chunk: its histories, the pooled idle-time prior, the choice's picks
    for its functions and the calibration."""

    histories: Histories
    end_minute: int
    horizon: int
    prior: FloatArray
    choice: Choice
    training_minutes: int


def forecast_chunk(task: ForecastTask) -> dict[str, Forecast]:
    """One chunk's forecasts (pure: runs on any engine)."""
    histories, end_minute, horizon, choice = task.histories, task.end_minute, task.horizon, task.choice
    gaps = {function: idle_minutes(series) for function, series in histories.items()}
    windows = _hybrid_windows(gaps)
    idle = idle_answers(histories, gaps, horizon, task.prior)
    out: dict[str, Forecast] = {}
    for kind, functions in classes(histories).items():
        plans = {function: choice.models(function, kind) for function in functions}
        by_model: dict[str, list[str]] = {}
        for function, plan in plans.items():
            for name in dict.fromkeys(plan):
                by_model.setdefault(name, []).append(function)
        predicted: dict[tuple[str, str], FloatArray] = {}
        for name, members in by_model.items():
            frame = _frame(members, histories, end_minute, task.training_minutes)
            for function, rows in _engine([name]).forecast(df=frame, h=horizon).groupby("unique_id"):
                predicted[name, str(function)] = rows[name].to_numpy(dtype=np.float64)
        for function, (short, later) in plans.items():
            expected = predicted[later, function].copy()
            expected[:SHORT_STEPS] = predicted[short, function][:SHORT_STEPS]
            expected = np.clip(expected, 0.0, None)
            prewarm, keepalive = windows[function]
            out[function] = Forecast(
                function=function,
                start_minute=end_minute,
                expected=expected,
                p_invoked=probability(expected, choice.calibration.get(kind)),
                p_within=within_probability(expected, choice.within.get(kind)),
                prewarm_minutes=prewarm,
                keepalive_minutes=keepalive,
                model=later,
                short_model=short,
                relative_mae=choice.relative_mae.get(function),
                p_within_idle=idle[function][0],
                pattern=idle[function][1],
                elapsed_minutes=idle[function][2],
                p_within_phase=idle[function][3],
            )
    return out


def classes(histories: Mapping[str, npt.NDArray[np.int64]]) -> dict[str, list[str]]:
    """Functions by class, from the share of recent minutes with an invocation."""
    out: dict[str, list[str]] = {"sparse": [], "busy": []}
    for function, counts in histories.items():
        share = float(np.count_nonzero(counts)) / len(counts)
        out["busy" if share >= BUSY_SHARE else "sparse"].append(function)
    return out


class Forecaster:
    """Forecasts every function the history knows, a chunk at a time on its `engine`.

    `stop`: once set, a running `choose` or `forecast` gives up at the next chunk (raising
    `Stopped`), so a service shutting down waits seconds for its worker thread, not a cycle."""

    def __init__(
        self,
        counts: MinuteCounts,
        *,
        training_minutes: int = TRAINING_MINUTES,
        stop: threading.Event | None = None,
        engine: Engine | None = None,
    ) -> None:
        self.counts = counts
        self.training_minutes = training_minutes
        self.stop = stop or threading.Event()
        self.engine: Engine = engine or LocalEngine()
        self.choice = Choice()

    def histories(self, end_minute: int, functions: Sequence[str] | None = None) -> Histories:
        """The last `training_minutes` of counts of `functions` (default: every function)."""
        names = self.counts.functions if functions is None else functions
        return {f: self.counts.series(f, end_minute, self.training_minutes) for f in names}

    def chunks(self, end_minute: int, functions: Sequence[str] | None = None) -> Iterator[Histories]:
        """The histories of `functions` (default: all), `CHUNK_FUNCTIONS` at a time: what
        bounds a cycle's memory."""
        names = self.counts.functions if functions is None else functions
        for first in range(0, len(names), CHUNK_FUNCTIONS):
            if self.stop.is_set():
                raise Stopped("forecast cycle stopped")
            yield self.histories(end_minute, names[first : first + CHUNK_FUNCTIONS])

    def classes(
        self, end_minute: int, histories: Mapping[str, npt.NDArray[np.int64]] | None = None
    ) -> dict[str, list[str]]:
        """Functions by class, from the share of recent minutes with an invocation."""
        return classes(histories if histories is not None else self.histories(end_minute))

    def choose(self, end_minute: int, *, horizon: int = 30, engine: Engine | None = None) -> Choice:
        """Backtest the candidate models over the last windows; keep the best per function."""
        kinds: dict[str, list[str]] = {"sparse": [], "busy": []}
        volume: dict[str, int] = {}
        for histories in self.chunks(end_minute):
            for kind, functions in classes(histories).items():
                kinds[kind] += functions
            volume.update({f: int(series.sum()) for f, series in histories.items()})
        groups: list[tuple[str, list[str], bool]] = [("sparse", kinds["sparse"], False)]
        busiest = set(sorted(kinds["busy"], key=volume.__getitem__, reverse=True)[:AUTOETS_LIMIT])
        groups += [
            ("busy", sorted(busiest), True),
            ("busy", [f for f in kinds["busy"] if f not in busiest], False),
        ]
        tasks = (
            BacktestTask(histories, end_minute, horizon, kind, with_ets, self.training_minutes)
            for kind, members, with_ets in groups
            for histories in self.chunks(end_minute, members)
        )
        choice = Choice()
        tallies: dict[str, FloatArray] = {}
        for picks in (engine or self.engine).map(backtest, tasks):
            choice.model.update(picks.model)
            choice.short_model.update(picks.short_model)
            choice.relative_mae.update(picks.relative_mae)
            tallies[picks.kind] = tallies.get(picks.kind, 0) + picks.tallies
        for kind, tally in tallies.items():
            choice.calibration[kind] = _calibrated(tally[0])
            choice.within[kind] = np.stack([_calibrated(t) for t in tally[1:]])
        self.choice = choice
        return choice

    def forecast(
        self,
        end_minute: int,
        horizon: int = 30,
        *,
        functions: Sequence[str] | None = None,
        engine: Engine | None = None,
    ) -> dict[str, Forecast]:
        """Forecasts for minutes [end_minute, end_minute + horizon) of every function (only
        `functions`, when given), a chunk at a time, every chunk's idle times shrunk towards the
        pool of all of them."""
        pooled, elapsed = np.zeros(idletimes.BINS), []  # the running periods, as `idle_answers` counts them
        for chunk in self.chunks(end_minute):
            for series in chunk.values():
                pooled += idletimes.counts(idle_minutes(series))
                if (last := _last_invoked(series)) >= 0:
                    elapsed.append(len(series) - last)
        prior = idletimes.pooled_hazard(pooled, idletimes.counts(elapsed))
        tasks = (
            ForecastTask(chunk, end_minute, horizon, prior, self.choice.of(chunk), self.training_minutes)
            for chunk in self.chunks(end_minute, functions)
        )
        out: dict[str, Forecast] = {}
        for forecasts in (engine or self.engine).map(forecast_chunk, tasks):
            out.update(forecasts)
        return out


def _frame(
    functions: Sequence[str], histories: Mapping[str, npt.NDArray[np.int64]], end_minute: int, length: int
) -> pd.DataFrame:
    values = np.concatenate([histories[f] for f in functions]).astype(np.float64)
    return pd.DataFrame(
        {
            "unique_id": np.repeat(np.asarray(functions, dtype=object), length),
            "ds": np.tile(np.arange(end_minute - length, end_minute), len(functions)),
            "y": values,
        }
    )


def _hybrid_windows(gaps: Mapping[str, FloatArray]) -> dict[str, tuple[float, float]]:
    """Each function's hybrid histogram (pre-warm, keep-alive) after its observed idle times,
    for all functions in one batch: each sequence ends with a period not yet observed, whose
    windows are the ones in force now (the policy is online)."""
    functions = list(gaps)
    sequences = [np.append(gaps[f], 0.0) for f in functions]
    offsets = np.concatenate(([0], np.cumsum([len(g) for g in sequences]))).astype(np.int64)
    flat = np.concatenate(sequences) if sequences else np.zeros(0)
    prewarm, keepalive = histogram.batch_windows(flat, offsets)
    return {
        f: (float(prewarm[offsets[i + 1] - 1]), float(keepalive[offsets[i + 1] - 1]))
        for i, f in enumerate(functions)
    }


def idle_answers(
    histories: Mapping[str, npt.NDArray[np.int64]],
    gaps: Mapping[str, FloatArray],
    horizon: int,
    prior: FloatArray | None = None,
) -> dict[str, tuple[FloatArray | None, idletimes.Pattern, int | None, FloatArray | None]]:
    """Each function's `idletimes` answer for the minutes after its series, its class, its idle
    minutes (None before its first invocation) and its `phase` answer (None where it has none),
    all at once, shrunk towards `prior` (by default the pooled hazard of these histories)."""
    functions = list(histories)
    if not functions:
        return {}
    own = np.stack([idletimes.counts(gaps[f]) for f in functions])
    last = np.array([_last_invoked(histories[f]) for f in functions], dtype=np.int64)
    elapsed = np.array([len(histories[f]) for f in functions], dtype=np.int64) - last
    if prior is None:
        prior = idletimes.pooled_hazard(own.sum(axis=0), idletimes.counts(elapsed[last >= 0]))
    within = idletimes.within_after(own, elapsed, horizon, prior)
    within[last < 0] = np.nan
    length = max(len(series) for series in histories.values())
    invoked = np.zeros((len(functions), length), dtype=np.bool_)
    for i, f in enumerate(functions):  # shorter series: no calls before they begin
        invoked[i, length - len(histories[f]) :] = histories[f] > 0
    by_phase = phase.within_by_phase(invoked, within)
    classes = idletimes.patterns(own)
    phase_answers = phase.known(by_phase)
    return {
        f: (within[i], classes[i], int(elapsed[i]), phase_answers[i])
        if last[i] >= 0
        else (None, classes[i], None, None)
        for i, f in enumerate(functions)
    }


def _last_invoked(series: npt.NDArray[np.int64]) -> int:
    invoked = np.flatnonzero(series)
    return int(invoked[-1]) if invoked.size else -1


def _engine(names: Sequence[str]) -> StatsForecast:
    return StatsForecast(models=[model(n) for n in names], freq=1, n_jobs=1, fallback_model=Naive())


def _pick(backtest: pd.DataFrame, names: Sequence[str], choice: Choice) -> pd.DataFrame:
    """Record each function's best models (lowest backtest MAE) for the first SHORT_STEPS
    minutes and for the rest; the backtest with `chosen`, what those picks forecast."""
    errors = backtest.assign(**{n: (backtest[n] - backtest["y"]).abs() for n in names})
    short = (backtest["ds"] - backtest["cutoff"]).to_numpy() <= SHORT_STEPS
    short_best, later_best = (_best(errors[rows], names) for rows in (short, ~short))
    for function, name in later_best.items():
        choice.model[str(function)] = str(name)
        choice.short_model[str(function)] = str(short_best[function])
    picked = np.where(
        short,
        _chosen_column(backtest, short_best),
        _chosen_column(backtest, later_best),
    )
    chosen = backtest.assign(chosen=picked)
    mae = (chosen["chosen"] - chosen["y"]).abs().groupby(chosen["unique_id"]).mean()
    persistence = errors.groupby("unique_id")["Naive"].mean()
    for function, value in mae.items():
        if persistence[function] > 0:
            choice.relative_mae[str(function)] = float(value / persistence[function])
    return chosen


def _best(errors: pd.DataFrame, names: Sequence[str]) -> pd.Series:
    """Per function, the model with the lowest mean error; persistence unless one beats it
    clearly (small backtest wins do not carry)."""
    mae = errors.groupby("unique_id")[list(names)].mean()
    best = mae.idxmin(axis=1)
    return best.where(mae.min(axis=1) < (1.0 - SWITCH_MARGIN) * mae["Naive"], "Naive")


def _chosen_column(backtest: pd.DataFrame, best: pd.Series) -> FloatArray:
    """Per backtest row, the forecast of the model `best` names for its function."""
    picked = np.empty(len(backtest))
    of_row = backtest["unique_id"].map(best).to_numpy()
    for model in best.unique():
        rows = of_row == model
        picked[rows] = backtest.loc[rows, model].to_numpy()
    return picked


def _tally(expected: FloatArray, observed: FloatArray) -> FloatArray:
    """Per bin of expected count: minutes with >= 1 invocation, and minutes (rows 0 and 1).
    Tallies of chunks add up to the tally of all of them."""
    bins = np.clip(
        np.searchsorted(CALIBRATION_EDGES, expected, side="right") - 1, 0, len(CALIBRATION_EDGES) - 2
    )
    size = len(CALIBRATION_EDGES) - 1
    hits = np.bincount(bins, weights=(observed > 0).astype(float), minlength=size)
    return np.stack([hits, np.bincount(bins, minlength=size).astype(np.float64)])


def _calibrated(tally: FloatArray) -> FloatArray:
    """Observed share of minutes with >= 1 invocation per bin of expected count (monotone)."""
    hits, totals = tally
    prior = 1.0 - np.exp(-_bin_centres())  # Poisson, where a bin saw no backtest minute
    share = np.where(totals > 0, (hits + prior) / (totals + 1.0), prior)
    return np.maximum.accumulate(share)  # more expected invocations never mean fewer


def _bin_centres() -> FloatArray:
    upper = np.where(np.isfinite(CALIBRATION_EDGES[1:]), CALIBRATION_EDGES[1:], CALIBRATION_EDGES[-2] * 2)
    return (CALIBRATION_EDGES[:-1] + upper) / 2


# Horizons share a calibration table within a bucket: k = 1, 2-5, 6-10, 11 and beyond.
WITHIN_BUCKETS = np.array([1, 2, 6, 11])


def _calibration_tallies(backtest: pd.DataFrame) -> FloatArray:
    """What calibration needs of one chunk's backtest, summable over chunks: the `_tally` of
    each minute (index 0) and, per bucket of k (1 on), of the expected total over the first k
    minutes against any invocation in them (minutes within a window are not independent:
    "within k" is measured, not multiplied)."""
    ordered = backtest.sort_values(["unique_id", "cutoff", "ds"])
    keys = [ordered["unique_id"], ordered["cutoff"]]
    total = ordered["chosen"].clip(lower=0).groupby(keys).cumsum().to_numpy()
    seen = (ordered["y"] > 0).groupby(keys).cummax().to_numpy().astype(np.float64)
    k = ordered.groupby(keys).cumcount().to_numpy() + 1
    bucket = np.searchsorted(WITHIN_BUCKETS, k, side="right") - 1
    minutes = _tally(backtest["chosen"].to_numpy(dtype=np.float64), backtest["y"].to_numpy(dtype=np.float64))
    within = [_tally(total[bucket == b], seen[bucket == b]) for b in range(len(WITHIN_BUCKETS))]
    return np.stack([minutes, *within])


def within_probability(expected: FloatArray, table: FloatArray | None) -> FloatArray:
    """P(>= 1 invocation within the first k minutes), k = 1..horizon; never decreasing in k."""
    total = np.cumsum(np.clip(expected, 0.0, None))
    if table is None:
        return 1.0 - np.exp(-total)
    bucket = np.searchsorted(WITHIN_BUCKETS, np.arange(1, total.size + 1), side="right") - 1
    bins = np.clip(np.searchsorted(CALIBRATION_EDGES, total, side="right") - 1, 0, len(CALIBRATION_EDGES) - 2)
    return np.maximum.accumulate(table[bucket, bins])


def probability(expected: FloatArray, calibration: FloatArray | None) -> FloatArray:
    """P(>= 1 invocation) per minute: calibrated when a backtest ran, else Poisson."""
    if calibration is None:
        return 1.0 - np.exp(-np.clip(expected, 0.0, None))
    bins = np.clip(
        np.searchsorted(CALIBRATION_EDGES, expected, side="right") - 1, 0, len(CALIBRATION_EDGES) - 2
    )
    return calibration[bins]
