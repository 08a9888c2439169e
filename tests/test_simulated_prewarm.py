"""The prewarm planner inside the simulator: the engine applies its min-scale and pre-pulls."""

from __future__ import annotations

import numpy as np
import pytest

from forecaster import phase
from forecaster.forecasting import Forecast, idle_answers
from policies import heuristics
from policies.types import NodeTable
from prewarm.planning import DEFAULT_COLD_START_S, PlannerSettings, Reason
from simulator import clusterspec, engine, keepalive, nodes, prewarming
from tests.test_engine import one_function
from tests.test_phase import hourly_bursts

MINUTES = 60


def flat_forecasts(function: str, every: int) -> prewarming.ForecastSchedule:
    """A model that knows only the average rate: one invocation every 12 minutes."""
    horizon = prewarming.HORIZON_MINUTES

    def block(start: int) -> Forecast:
        rate = np.full(horizon, 1 / 12)
        return Forecast(
            function=function,
            start_minute=start,
            expected=rate,
            p_invoked=1 - np.exp(-rate),
            p_within=1 - np.exp(-np.cumsum(rate)),
            prewarm_minutes=0.0,
            keepalive_minutes=240.0,
            model="CrostonSBA",
            relative_mae=None,
        )

    return prewarming.ForecastSchedule(
        every=every, blocks=tuple({function: block(s)} for s in range(0, MINUTES, every))
    )


def run(policy: str, *, pull: bool = True) -> engine.RunResult:
    workload = one_function()
    counts = np.zeros((1, MINUTES), dtype=np.int64)
    counts[0, ::12] = 1  # every 12 minutes: Knative's default scales to zero in between
    cluster = clusterspec.load("small")
    prewarmer = None
    if policy == "prewarm":
        prewarmer = prewarming.SimulatedPrewarm(
            schedule=flat_forecasts(workload.functions[0].service, every=10),
            states=prewarming.function_states(workload),
            policy=heuristics.kube_default(),
            budget=prewarming.budget(cluster),
            pull=pull,
        )
    return engine.Simulation(
        workload=workload,
        counts=counts,
        cluster=cluster,
        placement=heuristics.kube_default(),
        keepalive=keepalive.by_name("knative" if prewarmer is None else "prewarm"),
        seed=1,
        prewarmer=prewarmer,
    ).run()


def test_the_planner_keeps_a_periodic_function_warm_where_knative_scales_it_to_zero() -> None:
    knative, planned = run("knative"), run("prewarm")
    assert knative.cold_starts[0] == 5  # every invocation starts from zero
    # Memory is capped at what the hybrid histogram would hold: nothing before the first
    # invocation, so the first ones start cold; then the pool and the function's own 12-minute
    # period keep it warm.
    assert 0 < planned.cold_starts[0] <= 2
    assert planned.wasted_mb_s[0] > knative.wasted_mb_s[0]  # warmth is not free


def test_without_pull_the_planner_pulls_nothing_ahead() -> None:
    assert run("prewarm", pull=False).prepulls == 0


def test_the_budget_is_a_tenth_of_the_cluster_memory() -> None:
    cluster = clusterspec.load("small")
    memory = sum(pool.count * pool.memory_bytes for pool in cluster.pools)
    assert prewarming.budget(cluster).warm_memory_bytes == int(0.1 * memory)


def test_the_simulated_planner_prices_the_cold_starts_the_engine_observed() -> None:
    workload = one_function()
    function = workload.functions[0].service
    cluster = clusterspec.load("small")
    prewarmer = prewarming.SimulatedPrewarm(
        schedule=flat_forecasts(function, every=10),
        states=prewarming.function_states(workload),
        policy=heuristics.kube_default(),
        budget=prewarming.budget(cluster),
        settings=PlannerSettings(scale_down_utilization=0.0, hybrid_memory_share=None),
    )
    counts = np.zeros((1, 2), dtype=np.int64)
    table, _ = nodes.Nodes(cluster).table(0.0)

    def benefit(minute: int, observed: list[float]) -> float:
        (entry,) = prewarmer.plan(minute, counts[:, :minute], table, [observed]).warm
        return entry.reason.benefit_usd

    before = benefit(0, [])
    after = benefit(1, [2.0, 3.0, 40.0])  # the same forecast minute-on: the same probability
    assert before > 0 and after / before == pytest.approx(3.0 / DEFAULT_COLD_START_S)


def reason_before_the_burst(monkeypatch: pytest.MonkeyPatch, *, phase_allowed: bool) -> Reason | None:
    """The plan's reason two minutes before the twelfth hour's burst at :06 of a function with
    stray calls after some bursts, planned minute by minute from the start."""
    if not phase_allowed:  # no loss is ever this much lower: the idle-time answer throughout
        monkeypatch.setattr(phase, "MARGIN", 1.0)
    workload = one_function()
    cluster = clusterspec.load("small")
    prewarmer = prewarming.SimulatedPrewarm(
        schedule=flat_forecasts(workload.functions[0].service, every=10),
        states=prewarming.function_states(workload),
        policy=heuristics.kube_default(),
        budget=prewarming.budget(cluster),
        settings=PlannerSettings(scale_down_utilization=0.0, hybrid_memory_share=None),
    )
    now = 11 * 60 + 4
    counts = hourly_bursts(12, strays=(3, 20, 0, 8, 14))[None, :now]
    table, _ = nodes.Nodes(cluster).table(0.0)
    for minute in range(now + 1):
        planned = prewarmer.plan(minute, counts[:, :minute], table, [[]])
    return planned.warm[0].reason if planned.warm else None


def test_the_simulated_planner_warms_an_hourly_burst_by_its_minute_of_the_hour(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken = reason_before_the_burst(monkeypatch, phase_allowed=True)
    assert taken is not None and taken.answer == "phase" and taken.probability > 0.9
    # The stray calls restart the idle clock: the idle-time answer alone hedges.
    hedged = reason_before_the_burst(monkeypatch, phase_allowed=False)
    assert hedged is not None and hedged.answer == "idle" and hedged.probability < 0.6


def test_a_function_first_invoked_between_blocks_is_forecast_the_minute_after() -> None:
    """The service forecasts every function every minute; the simulator's blocks come every ten,
    so a function first invoked between them gets its own forecast the minute after."""
    counts = np.zeros((3, 30), dtype=np.int64)
    counts[0, :] = 1
    counts[1, 13] = 4  # first invoked in minute 13, between the blocks of minutes 10 and 20
    counts[2, 3] = 2  # before the first block: it starts with the others there
    schedule = prewarming.forecast_schedule(counts, ["steady", "new", "early"], every=10)
    assert "new" not in schedule.blocks[1] and "new" in schedule.blocks[2]
    assert schedule.newcomer("new", 13) is None  # not made before the minute after the call
    made = schedule.newcomer("new", 15)
    assert made is not None and made.start_minute == 14
    assert {"steady", "early"} <= set(schedule.blocks[1])
    assert schedule.newcomer("steady", 9) is None and schedule.newcomer("early", 9) is None


def one_function_planner(
    counts: np.ndarray, settings: PlannerSettings | None = None
) -> tuple[str, prewarming.SimulatedPrewarm, NodeTable]:
    """`one_function`'s name, the simulated planner of its `counts` (forecast in blocks of ten
    minutes) and the `small` cluster's nodes at the start."""
    workload = one_function()
    function = workload.functions[0].service
    cluster = clusterspec.load("small")
    prewarmer = prewarming.SimulatedPrewarm(
        schedule=prewarming.forecast_schedule(counts, [function], every=10),
        states=prewarming.function_states(workload),
        policy=heuristics.kube_default(),
        budget=prewarming.budget(cluster),
        settings=settings or prewarming.planner_settings(drain_underused=False),
    )
    table, _ = nodes.Nodes(cluster).table(0.0)
    return function, prewarmer, table


def test_the_simulated_planner_weighs_a_new_function_from_the_minute_after_its_first_call() -> None:
    counts = np.zeros((1, 20), dtype=np.int64)
    counts[0, 13] = 4
    settings = PlannerSettings(scale_down_utilization=0.0, hybrid_memory_share=None)
    function, prewarmer, table = one_function_planner(counts, settings)
    weighed = []
    for minute in range(20):
        planned = prewarmer.plan(minute, counts[:, :minute], table, [[]])
        weighed.append(bool(planned.warm) or any(name == function for name, _ in planned.skipped))
    assert weighed.index(True) == 14  # the next block, at minute 20, would have been too late


def test_the_simulated_planner_answers_from_idle_times_as_the_forecaster_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its per-minute idle-time answers are the forecaster's (`idle_answers`) over the same
    minutes: the same pool of ended and still running idle periods."""
    counts = np.zeros((1, 60), dtype=np.int64)
    counts[0, [0, 4, 8, 12, 30]] = 1  # idle since minute 30: a period still running at 45
    function, prewarmer, table = one_function_planner(counts)
    seen: dict[int, Forecast] = {}
    planning = prewarming.plan

    def plan(minute: int, forecasts: dict[str, Forecast], *args: object, **kwargs: object) -> object:
        if function in forecasts:  # none before the first block
            seen[minute] = forecasts[function]
        return planning(minute, forecasts, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(prewarming, "plan", plan)
    for minute in range(46):
        prewarmer.plan(minute, counts[:, :minute], table, [[]])
    history = {function: counts[0, :45]}
    gaps = {function: np.diff(np.flatnonzero(history[function])).astype(np.float64)}
    served = seen[45].p_within_idle
    expected = idle_answers(history, gaps, prewarming.HORIZON_MINUTES)[function][0]
    assert served is not None and expected is not None
    np.testing.assert_array_equal(served, expected)
