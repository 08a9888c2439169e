"""The prewarm planner on hand-built forecasts: who gets warm capacity, how much, and why."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from forecaster.forecasting import Forecast
from policies import heuristics
from policies.types import Node, NodeTable, PodRequest, Priority
from prewarm.planning import Budget, FunctionState, PlannerSettings, plan

GiB = 1 << 30
NOW = 1_000
IMAGE = "registry.example.com/fn@sha256:1"


def forecast(function: str, *, probability: float, per_minute: float = 0.1) -> Forecast:
    horizon = 30
    return Forecast(
        function=function,
        start_minute=NOW,
        expected=np.full(horizon, per_minute),
        p_invoked=np.full(horizon, probability / 5),
        p_within=np.full(horizon, probability),
        prewarm_minutes=0.0,
        keepalive_minutes=10.0,
        model="TSB",
        relative_mae=None,
    )


def state(function: str, priority: Priority = Priority.NORMAL, **changes: object) -> FunctionState:
    base = FunctionState(
        function=function,
        priority=priority,
        memory_bytes=GiB // 2,
        cold_start_s=8.0,
        concurrency_target=10.0,
        duration_s=0.5,
        pod=PodRequest(
            namespace="ns",
            name=f"{function}-pod",
            function=function,
            cpu_milli=250,
            memory_bytes=GiB // 2,
            images=(IMAGE,),
        ),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


NODES = NodeTable.from_nodes(
    [
        Node(name="has-image", cpu_allocatable=4000, memory_allocatable=16 * GiB, images={IMAGE: 300 << 20}),
        Node(name="empty-a", cpu_allocatable=4000, memory_allocatable=16 * GiB),
        Node(
            name="empty-b",
            cpu_allocatable=4000,
            memory_allocatable=16 * GiB,
            cpu_requested=3000,
            cpu_nonzero_requested=3000,
        ),
    ]
)
PLENTY = Budget(warm_memory_bytes=100 * GiB, pulls_per_minute=10)


def run(forecasts: list[Forecast], states: list[FunctionState], budget: Budget = PLENTY, **settings: object):  # type: ignore[no-untyped-def]
    return plan(
        NOW,
        {f.function: f for f in forecasts},
        {s.function: s for s in states},
        NODES,
        budget,
        policy=heuristics.kube_default(),
        settings=PlannerSettings(**settings),
    )  # type: ignore[arg-type]


def test_likely_invocations_get_a_warm_replica_until_the_window_ends() -> None:
    result = run([forecast("ns/a", probability=0.8)], [state("ns/a")])
    (entry,) = result.warm
    assert (entry.function, entry.replicas, entry.expires_minute) == ("ns/a", 1, NOW + 10)
    assert entry.reason.probability == pytest.approx(0.8)
    assert entry.reason.benefit_usd > entry.reason.cost_usd


@pytest.mark.parametrize(
    ("the_state", "why"),
    [
        (state("ns/a", Priority.BATCH), "batch functions are never prewarmed"),
        (state("ns/a", prewarm_allowed=False), "opted out"),
    ],
)
def test_batch_and_opted_out_functions_are_left_alone(the_state: FunctionState, why: str) -> None:
    result = run([forecast("ns/a", probability=0.99)], [the_state])
    assert result.warm == () and result.skipped[0][1].startswith(why)


def test_unknown_and_unlikely_functions_are_skipped_with_a_reason() -> None:
    result = run(
        [forecast("ns/ghost", probability=0.9), forecast("ns/quiet", probability=0.01)], [state("ns/quiet")]
    )
    assert dict(result.skipped) == {
        "ns/ghost": "no state (unknown to the cluster)",
        "ns/quiet": "unlikely to be invoked soon",
    }


def test_priority_decides_when_benefit_is_marginal() -> None:
    big = {"memory_bytes": 8 * GiB}
    result = run(
        [forecast("ns/crit", probability=0.3), forecast("ns/low", probability=0.3)],
        [state("ns/crit", Priority.CRITICAL, **big), state("ns/low", Priority.LOW, **big)],
    )
    assert [w.function for w in result.warm] == ["ns/crit"]
    assert ("ns/low", "cost exceeds benefit") in result.skipped


def test_busy_functions_get_enough_replicas_for_their_concurrency() -> None:
    # 600 invocations a minute x 2 s each = 20 in flight; target 4 per pod -> 5 replicas
    result = run(
        [forecast("ns/busy", probability=1.0, per_minute=600)],
        [state("ns/busy", duration_s=2.0, concurrency_target=4.0)],
    )
    assert result.replicas("ns/busy") == 5


def test_never_above_the_revisions_max_scale() -> None:
    # 5 replicas would serve the concurrency, but Knative runs at most 2: hold no more than that
    result = run(
        [forecast("ns/busy", probability=1.0, per_minute=600)],
        [state("ns/busy", duration_s=2.0, concurrency_target=4.0, max_scale=2)],
    )
    assert result.replicas("ns/busy") == 2


def test_never_below_the_authors_min_scale() -> None:
    result = run([forecast("ns/a", probability=0.9)], [state("ns/a", author_min_scale=3)])
    assert result.replicas("ns/a") == 3


def test_the_budget_goes_to_the_highest_value_per_byte() -> None:
    states = [
        state("ns/small", Priority.HIGH, memory_bytes=GiB // 4),
        state("ns/large", Priority.HIGH, memory_bytes=4 * GiB),
    ]
    result = run(
        [forecast("ns/small", probability=0.9), forecast("ns/large", probability=0.9)],
        states,
        budget=Budget(warm_memory_bytes=2 * GiB, pulls_per_minute=10),
    )
    assert [w.function for w in result.warm] == ["ns/small"]
    assert ("ns/large", "warm-memory budget exhausted") in result.skipped


def test_pulls_go_to_the_policys_top_nodes_that_lack_the_image() -> None:
    result = run([forecast("ns/a", probability=0.9)], [state("ns/a")], prepull_nodes=2)
    # kube-default ranks has-image first (image locality, room), then empty-a; only empty-a needs a pull
    assert [(p.node, p.image) for p in result.pulls] == [("empty-a", IMAGE)]


def test_pulls_respect_the_rate_limit() -> None:
    forecasts = [forecast(f"ns/f{i}", probability=0.9) for i in range(5)]
    result = run(
        forecasts,
        [state(f"ns/f{i}") for i in range(5)],
        budget=Budget(100 * GiB, pulls_per_minute=2),
        prepull_nodes=3,
    )
    assert len(result.pulls) == 2
