"""The prewarm planner in the simulator: the service's forecaster and planner, minute by minute.

The service forecasts every minute; statsforecast takes ~0.6 s for a few hundred functions, so
a simulated day forecasts every `ForecastSchedule.every` minutes instead (online: each block is
forecast from the minutes before it alone, models re-chosen by backtest every few hours) and
shared by every run on the same trace. A function first invoked between blocks (from the
first on) is forecast alone the minute after, as the service's next cycle would (it is in the
service's history by then), so the planner weighs it from then on, not from the next block.
Each minute the planner sees the latest forecast moved on to that minute (`Forecast.later`)
with the idle-time answer of that very minute (each function's idle-time counts kept online,
shrunk towards their pool: `idletimes`), the cluster's nodes as the extender sees them, and
plans exactly as `kdrl serve` does; the engine applies the plan as the actuators would:
`min-scale` per function, and pre-pulls into its image model.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from forecaster import idletimes, phase
from forecaster.forecasting import BACKTEST_WINDOWS, Forecast, Forecaster
from forecaster.history import MinuteCounts
from policies.placement import PlacementPolicy
from policies.types import NodeTable
from prewarm.planning import Budget, FunctionState, PlannerSettings, PrewarmPlan, cold_start_estimate, plan
from simulator.clusterspec import ClusterSpec
from simulator.engine import pod_request
from simulator.nodes import SCALE_DOWN_UTILIZATION
from simulator.workload import Workload

IntArray = npt.NDArray[np.int64]
HORIZON_MINUTES = 30


@dataclass(frozen=True)
class ForecastSchedule:
    """Forecasts made online over a trace: block i at minute i x `every`, from earlier minutes;
    `newcomers`, each function first invoked between two blocks, forecast alone the minute after
    its first invocation (the next block has it too)."""

    every: int
    blocks: tuple[Mapping[str, Forecast], ...]
    newcomers: Mapping[str, Forecast] = field(default_factory=dict)

    def at(self, minute: int) -> tuple[int, Mapping[str, Forecast]]:
        """The latest block made at or before `minute`, and how many minutes old it is."""
        block = min(minute // self.every, len(self.blocks) - 1)
        return minute - block * self.every, self.blocks[block]

    def newcomer(self, function: str, minute: int) -> Forecast | None:
        """`function`'s forecast of the minute after its first invocation, if it has one and it
        was made by `minute`; a block made since has it too, and is the newer."""
        made = self.newcomers.get(function)
        return made if made is not None and made.start_minute <= minute else None


def forecast_schedule(
    counts: IntArray, functions: Sequence[str], *, every: int = 10, rechoose_every: int = 360
) -> ForecastSchedule:
    """Run the forecaster over the trace as the service would have: every function every
    `every` minutes from minute `every` on, and a function first invoked in between the minute
    after."""
    history = MinuteCounts()
    forecaster = Forecaster(history)
    blocks: list[Mapping[str, Forecast]] = []
    newcomers: dict[str, Forecast] = {}
    first_choice = BACKTEST_WINDOWS * HORIZON_MINUTES  # the backtest needs this much history
    for minute in range(counts.shape[1]):
        invoked = np.flatnonzero(counts[:, minute - 1]) if minute else np.zeros(0, dtype=np.int64)
        for row in invoked.tolist():
            history.add(functions[row], minute - 1, int(counts[row, minute - 1]))
        if minute % every == 0:
            if minute >= first_choice and (minute - first_choice) % rechoose_every == 0:
                forecaster.choose(minute, horizon=HORIZON_MINUTES)
            blocks.append(forecaster.forecast(minute, HORIZON_MINUTES) if minute else {})
            continue
        # Until the first block the planner has no forecast of anyone: the simulated service has
        # not begun, and a function first invoked then starts with the others at that block.
        if len(blocks) > 1:
            names = (functions[row] for row in invoked.tolist())
            new = [name for name in names if name not in blocks[-1] and name not in newcomers]
            if new:
                newcomers.update(forecaster.forecast(minute, HORIZON_MINUTES, functions=new))
    return ForecastSchedule(every=every, blocks=tuple(blocks), newcomers=newcomers)


# The warm-memory budget: a tenth of the cluster's memory at its start; pre-pulls per minute.
WARM_MEMORY_SHARE = 0.1
PULLS_PER_MINUTE = 20


def budget(cluster: ClusterSpec) -> Budget:
    memory = sum(pool.count * pool.memory_bytes for pool in cluster.pools)
    return Budget(warm_memory_bytes=int(WARM_MEMORY_SHARE * memory), pulls_per_minute=PULLS_PER_MINUTE)


def function_states(workload: Workload) -> dict[str, FunctionState]:
    """What the planner knows of each simulated function before any of its pods has started:
    the cold start is the service's default until the engine observes some (`SimulatedPrewarm`)."""
    return {
        spec.service: FunctionState(
            function=spec.service,
            priority=spec.priority,
            memory_bytes=spec.memory_bytes,
            cold_start_s=cold_start_estimate(()),
            pod=pod_request(spec),
            max_scale=spec.max_scale,
        )
        for spec in workload.functions
    }


def planner_settings(drain_underused: bool) -> PlannerSettings:
    """The planner's settings for the simulated cluster autoscaler: without the drain it releases
    only empty nodes, so any pod keeps a node up; with it, nodes under half allocated go too, as
    the service's default setting assumes of a real cluster."""
    return PlannerSettings(scale_down_utilization=SCALE_DOWN_UTILIZATION if drain_underused else 0.0)


@dataclass
class SimulatedPrewarm:
    """The planner as the engine calls it each minute (`Prewarmer`)."""

    schedule: ForecastSchedule
    states: Mapping[str, FunctionState]
    policy: PlacementPolicy
    budget: Budget
    pull: bool = True
    settings: PlannerSettings = field(default_factory=lambda: planner_settings(drain_underused=False))
    _idle: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros((0, idletimes.BINS)))
    _last: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _scores: phase.Scores = field(default_factory=phase.Scores)
    _priced: dict[str, FunctionState] = field(default_factory=dict)  # `states`, cold starts as observed

    def plan(
        self, minute: int, counts: IntArray, nodes: NodeTable, startups_s: Sequence[Sequence[float]]
    ) -> PrewarmPlan:
        """The plan at the start of `minute`; `counts` holds every function's minutes so far,
        `startups_s` each one's latest creation-to-ready times (priced as the service does)."""
        names = list(self.states)
        if minute == 0:  # a new run: every function's idle-time counts, one row each
            self._idle = np.zeros((len(names), idletimes.BINS))
            self._last = np.full(len(names), -1, dtype=np.int64)
            self._scores = phase.Scores()
            self._priced = dict(self.states)
        else:
            invoked = np.flatnonzero(counts[:, minute - 1])
            seen = invoked[self._last[invoked] >= 0]
            lengths = np.minimum(minute - 1 - self._last[seen], idletimes.BINS - 1)
            self._idle[seen, lengths] += 1.0
            self._last[invoked] = minute - 1
        invoked = np.flatnonzero(self._last >= 0)
        elapsed = minute - self._last[invoked]
        prior = idletimes.pooled_hazard(self._idle.sum(axis=0), idletimes.counts(elapsed))
        within = np.full((len(names), HORIZON_MINUTES), np.nan)
        within[invoked] = idletimes.within_after(self._idle[invoked], elapsed, HORIZON_MINUTES, prior)
        window = counts[:, max(0, minute - phase.CYCLES * phase.PERIOD_MINUTES) : minute] > 0
        by_phase = phase.within_by_phase(window, within)
        classes = idletimes.patterns(self._idle)
        idle_answers, phase_answers = phase.known(within), phase.known(by_phase)
        _, block = self.schedule.at(minute)
        forecasts = {}
        for row, name in enumerate(names):
            made = block.get(name)
            if made is None:
                made = self.schedule.newcomer(name, minute)
            if made is None:  # not invoked yet, or only before the first block: none made
                continue
            forecasts[name] = made.later(
                minute - made.start_minute,
                p_within_idle=idle_answers[row],
                pattern=classes[row],
                elapsed_minutes=minute - int(self._last[row]) if self._last[row] >= 0 else None,
                p_within_phase=phase_answers[row],
            )
        forecasts = self._scores.choose(forecasts, self.settings.lookahead_minutes)
        # `states` are in the workload's order, as the engine's rows are; a copy only where the
        # estimate moved (most minutes, none has).
        for (name, state), observed in zip(self.states.items(), startups_s, strict=True):
            estimate = cold_start_estimate(observed)
            if self._priced[name].cold_start_s != estimate:
                self._priced[name] = replace(state, cold_start_s=estimate)
        budget = self.budget if self.pull else Budget(self.budget.warm_memory_bytes, pulls_per_minute=0)
        return plan(
            minute, forecasts, self._priced, nodes, budget, policy=self.policy, settings=self.settings
        )
