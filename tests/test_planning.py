"""The prewarm planner on hand-built forecasts: who gets warm capacity, how much, and why."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bench import planner as planner_bench
from forecaster.forecasting import Forecast
from policies import heuristics
from policies.types import Node, NodeTable, PodRequest, Priority
from prewarm.planning import (
    DEFAULT_COLD_START_S,
    Budget,
    FunctionState,
    PlannerSettings,
    cold_start_estimate,
    free_gpu,
    free_memory,
    hybrid_idle_memory,
    nodes_kept_up,
    plan,
    plan_json,
)

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
        elapsed_minutes=1,  # invoked the minute before: inside the hybrid's keep-alive window
    )


def state(function: str, priority: Priority = Priority.NORMAL, **changes: object) -> FunctionState:
    base = FunctionState(
        function=function,
        priority=priority,
        memory_bytes=GiB // 2,
        cold_start_s=8.0,
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
    settings.setdefault("hybrid_memory_share", None)  # the hybrid's memory cap has its own test
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


def test_opted_out_functions_are_left_alone() -> None:
    result = run([forecast("ns/a", probability=0.99)], [state("ns/a", prewarm_allowed=False)])
    assert result.warm == () and result.skipped[0][1].startswith("opted out")


def test_batch_gets_what_the_others_leave() -> None:
    forecasts = [forecast("ns/batch", probability=0.9), forecast("ns/normal", probability=0.9)]
    states = [state("ns/batch", Priority.BATCH), state("ns/normal")]
    roomy = run(forecasts, states, hybrid_memory_share=None)
    assert {w.function for w in roomy.warm} == {"ns/batch", "ns/normal"}
    tight = run(forecasts, states, budget=Budget(warm_memory_bytes=GiB // 2, pulls_per_minute=0))
    assert [w.function for w in tight.warm] == ["ns/normal"]
    assert ("ns/batch", "warm-memory budget exhausted") in tight.skipped


def test_unknown_and_unlikely_functions_are_skipped_with_a_reason() -> None:
    result = run(
        [forecast("ns/ghost", probability=0.9), forecast("ns/quiet", probability=0.001)], [state("ns/quiet")]
    )
    assert dict(result.skipped) == {
        "ns/ghost": "no state (unknown to the cluster)",
        "ns/quiet": "unlikely to be invoked soon",
    }


def test_the_budget_keeps_more_functions_warm_by_favouring_small_ones() -> None:
    # Per expected idle byte the big `high` function is worth more (0.064 $/GiB against 0.024),
    # so the knapsack for cold-start seconds (exponent 1) warms it alone in the 2 GiB; favouring
    # size (the default, 3) warms the two small ones instead, and the big one waits.
    forecasts = [
        forecast("ns/big", probability=0.8),
        forecast("ns/small-a", probability=0.6),
        forecast("ns/small-b", probability=0.6),
    ]
    two_gib = {"memory_bytes": 2 * GiB}
    states = [
        state("ns/big", Priority.HIGH, **two_gib),
        state("ns/small-a"),
        state("ns/small-b"),
    ]
    budget = Budget(warm_memory_bytes=2 * GiB, pulls_per_minute=0)
    by_seconds = run(forecasts, states, budget=budget, size_exponent=1.0)
    assert [w.function for w in by_seconds.warm] == ["ns/big"]
    by_functions = run(forecasts, states, budget=budget)
    assert [w.function for w in by_functions.warm] == ["ns/small-a", "ns/small-b"]
    assert ("ns/big", "warm-memory budget exhausted") in by_functions.skipped


def test_priority_decides_when_benefit_is_marginal() -> None:
    big = {"memory_bytes": 8 * GiB}
    result = run(
        [forecast("ns/crit", probability=0.3), forecast("ns/low", probability=0.3)],
        [state("ns/crit", Priority.CRITICAL, **big), state("ns/low", Priority.LOW, **big)],
        scale_down_utilization=1.0,  # no node stays up regardless: every replica pays node-hours
    )
    assert [w.function for w in result.warm] == ["ns/crit"]
    assert ("ns/low", "cost exceeds benefit") in result.skipped


def test_a_busy_function_is_held_at_one_replica_and_knative_scales_it() -> None:
    # 600 invocations a minute: one warm replica spares the start from zero; more would be
    # Knative's autoscaler's to add on load, not the budget's to hold idle.
    result = run([forecast("ns/busy", probability=1.0, per_minute=600)], [state("ns/busy")])
    assert result.replicas("ns/busy") == 1


def test_never_above_the_revisions_max_scale() -> None:
    # The author asks for 3 at least, but Knative runs at most 2: hold no more than that
    result = run([forecast("ns/a", probability=0.9)], [state("ns/a", author_min_scale=3, max_scale=2)])
    assert result.replicas("ns/a") == 2


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


def test_a_function_the_budget_leaves_cold_still_gets_its_image_pulled() -> None:
    # No memory to warm it: its next request starts cold, but need not wait for the pull.
    result = run(
        [forecast("ns/a", probability=0.9)],
        [state("ns/a")],
        budget=Budget(warm_memory_bytes=0, pulls_per_minute=10),
        prepull_nodes=2,
    )
    assert result.warm == () and ("ns/a", "warm-memory budget exhausted") in result.skipped
    assert [(p.function, p.node) for p in result.pulls] == [("ns/a", "empty-a")]


def test_pulls_respect_the_rate_limit() -> None:
    forecasts = [forecast(f"ns/f{i}", probability=0.9) for i in range(5)]
    result = run(
        forecasts,
        [state(f"ns/f{i}") for i in range(5)],
        budget=Budget(100 * GiB, pulls_per_minute=2),
        prepull_nodes=3,
    )
    assert len(result.pulls) == 2


def test_the_knapsack_takes_the_most_benefit_per_byte_under_the_cap() -> None:
    # Benefit per byte: a 0.9/0.5 GiB, b 0.6/0.5 GiB, c 0.9/2 GiB; 1 GiB of budget: a and b (the
    # optimum, 1.5 of benefit), not a and c (which would not fit) nor c alone (0.9).
    forecasts = [forecast(f"ns/{n}", probability=p) for n, p in (("a", 0.9), ("b", 0.6), ("c", 0.9))]
    states = [state("ns/a"), state("ns/b"), state("ns/c", memory_bytes=2 * GiB)]
    result = run(forecasts, states, budget=Budget(warm_memory_bytes=GiB, pulls_per_minute=0))
    assert {w.function for w in result.warm} == {"ns/a", "ns/b"}
    assert ("ns/c", "warm-memory budget exhausted") in result.skipped


def test_no_more_idle_memory_than_the_hybrid_histogram_would_leave() -> None:
    held = forecast("ns/held", probability=0.5)  # inside its keep-alive window
    gone = dataclasses.replace(forecast("ns/gone", probability=0.5), elapsed_minutes=30)  # past it
    sure = dataclasses.replace(forecast("ns/sure", probability=1.0), elapsed_minutes=30)
    states = [state("ns/held", cold_start_s=2.0), state("ns/gone"), state("ns/sure")]
    forecasts = {f.function: f for f in (held, gone, sure)}
    # The hybrid would hold ns/held alone, idle half the time.
    assert hybrid_idle_memory(forecasts, {s.function: s for s in states}, PlannerSettings()) == GiB // 4
    result = run([held, gone, sure], states, hybrid_memory_share=1.0)
    # ns/sure is charged the floor (5 % of 0.5 GiB), ns/gone half its memory: the target is
    # crossed, and ns/held, the least benefit per idle byte, is left cold.
    assert [w.function for w in result.warm] == ["ns/sure", "ns/gone"]
    assert ("ns/held", "warm-memory budget exhausted") in result.skipped
    # The plan says how far it went: what it expects to leave idle, against the target.
    assert result.idle_bytes == pytest.approx(0.05 * GiB / 2 + 0.5 * GiB / 2)
    assert result.idle_target_bytes == GiB // 4
    assert plan_json(result)["budget"] == {
        "expected_idle_bytes": round(0.275 * GiB),
        "target_idle_bytes": GiB // 4,
    }
    uncapped = run([held, gone, sure], states)
    assert uncapped.idle_target_bytes is None and len(uncapped.warm) == 3
    assert uncapped.idle_bytes == pytest.approx(result.idle_bytes + 0.5 * GiB / 2)


def test_a_busy_function_is_warmed_before_an_idle_one_of_equal_benefit() -> None:
    # Equal expected benefit (0.95 x 8 s = 0.38 x 20 s) and memory; held memory would tie them and
    # the name would pick ns/a-idle, but ns/b-busy is expected to waste a twelfth as much.
    forecasts = [forecast("ns/a-idle", probability=0.38), forecast("ns/b-busy", probability=0.95)]
    states = [state("ns/a-idle", cold_start_s=20.0), state("ns/b-busy")]
    result = run(forecasts, states, hybrid_memory_share=0.05)
    assert [w.function for w in result.warm] == ["ns/b-busy"]
    assert ("ns/a-idle", "warm-memory budget exhausted") in result.skipped


def test_a_replica_is_charged_at_least_the_idle_floor() -> None:
    held = forecast("ns/held", probability=0.5)  # the hybrid's: a quarter GiB idle, the target
    quiet_since = 30  # past the hybrid's keep-alive: it holds none of these
    sure = [
        dataclasses.replace(forecast(f"ns/s{i}", probability=0.999), elapsed_minutes=quiet_since)
        for i in range(4)
    ]
    states = [state("ns/held", cold_start_s=0.1), *(state(f.function) for f in sure)]
    floored = run([held, *sure], states, hybrid_memory_share=1.0, idle_floor=0.25)
    assert [w.function for w in floored.warm] == ["ns/s0", "ns/s1"]  # an eighth of a GiB each
    unfloored = run([held, *sure], states, hybrid_memory_share=1.0, idle_floor=0.0)
    assert {f.function for f in sure} <= {w.function for w in unfloored.warm}


def test_free_memory_on_nodes_that_stay_up_costs_only_power() -> None:
    nodes = NodeTable.from_nodes(
        [
            Node(name="busy", cpu_allocatable=4000, memory_allocatable=8 * GiB, memory_requested=6 * GiB),
            Node(name="idle", cpu_allocatable=4000, memory_allocatable=8 * GiB, memory_requested=GiB),
        ]
    )
    assert free_memory(nodes, scale_down_utilization=0.5) == 2 * GiB  # only `busy` stays up
    assert free_memory(nodes, scale_down_utilization=0.0) == 9 * GiB  # the simulator's rule: any pod
    forecasts = [forecast(f"ns/f{i}", probability=0.9 - i / 100) for i in range(5)]
    result = plan(
        NOW,
        {f.function: f for f in forecasts},
        {f"ns/f{i}": state(f"ns/f{i}") for i in range(5)},
        nodes,
        PLENTY,
        policy=heuristics.kube_default(),
        settings=PlannerSettings(hybrid_memory_share=None),
    )
    # Four half-GiB replicas fit the 2 GiB that stays up; the fifth would keep `idle` alive.
    assert [w.reason.paid for w in result.warm] == [False, False, False, False, True]
    unpaid, paid = result.warm[3].reason, result.warm[4].reason
    assert paid.cost_usd > 10 * unpaid.cost_usd


def kept_up_cluster(lone_pods_on_shared: int = 0) -> NodeTable:
    """`alone` ($2/h) runs one pod of ns/lone and nothing else; `shared` runs ns/other's pod (and
    `lone_pods_on_shared` of ns/lone's) beside 6 GiB of other requests: it stays up anyway."""
    half = GiB // 2
    shared_pods = {"ns/other": 1} | ({"ns/lone": lone_pods_on_shared} if lone_pods_on_shared else {})
    return NodeTable.from_nodes(
        [
            Node(
                name="alone",
                cpu_allocatable=4000,
                memory_allocatable=8 * GiB,
                cpu_requested=250,
                memory_requested=half,
                labels={"kdrl.dev/hourly-price": "2"},
                function_pods={"ns/lone": 1},
            ),
            Node(
                name="shared",
                cpu_allocatable=4000,
                memory_allocatable=8 * GiB,
                cpu_requested=250 * len(shared_pods),
                memory_requested=6 * GiB + half * len(shared_pods),
                labels={"kdrl.dev/hourly-price": "2"},
                function_pods=shared_pods,
            ),
        ]
    )


def test_a_function_whose_pods_alone_keep_a_node_up_is_charged_the_whole_node() -> None:
    states = {f: state(f) for f in ("ns/lone", "ns/other")}
    # Only empty nodes go (the simulator's rule): `alone` goes without its one pod.
    assert nodes_kept_up(kept_up_cluster(), states, 0.0) == {"ns/lone": pytest.approx(2 / 3600)}
    # Nodes under half allocated go (the cluster autoscaler's): `alone` goes with or without the
    # pod, which would be moved, so it keeps no node up.
    assert nodes_kept_up(kept_up_cluster(), states, 0.5) == {}
    # With a pod on a node that stays anyway, Knative can keep that one: no node is charged.
    assert nodes_kept_up(kept_up_cluster(lone_pods_on_shared=1), states, 0.0) == {}


def test_under_a_utilization_threshold_only_a_node_one_function_fills_is_its_to_pay() -> None:
    def fn(name: str, gib: int) -> FunctionState:
        return state(
            name, memory_bytes=gib * GiB, pod=dataclasses.replace(state(name).pod, memory_bytes=gib * GiB)
        )

    states = {"ns/big": fn("ns/big", 5), "ns/a": fn("ns/a", 3), "ns/b": fn("ns/b", 2)}
    node = {"cpu_allocatable": 4000, "memory_allocatable": 8 * GiB}
    nodes = NodeTable.from_nodes(
        [
            # 5 of 8 GiB: above the threshold with its pod, empty without it.
            Node(name="filled", memory_requested=5 * GiB, function_pods={"ns/big": 1}, **node),  # type: ignore[arg-type]
            # 5 of 8 GiB in two functions: without ns/a it would drain, but ns/b's pod moves too.
            Node(name="shared", memory_requested=5 * GiB, function_pods={"ns/a": 1, "ns/b": 1}, **node),  # type: ignore[arg-type]
        ]
    )
    assert set(nodes_kept_up(nodes, states, 0.5)) == {"ns/big"}


@pytest.mark.parametrize(("priority", "warmed"), [(Priority.NORMAL, False), (Priority.CRITICAL, True)])
def test_keeping_a_lone_pod_warm_pays_its_node_unless_the_call_is_worth_it(
    priority: Priority, warmed: bool
) -> None:
    states = {"ns/lone": state("ns/lone", priority), "ns/other": state("ns/other")}
    forecasts = {f: forecast(f, probability=0.8) for f in states}
    settings = PlannerSettings(hybrid_memory_share=None, scale_down_utilization=0.0)
    result = plan(
        NOW, forecasts, states, kept_up_cluster(), PLENTY, policy=heuristics.kube_default(), settings=settings
    )
    # Holding ns/lone holds `alone` at $2/h for the fifth of three minutes it idles ($0.02):
    # worth it to a critical function (0.8 x 8 s x $0.01 = $0.064), not to a normal one
    # ($0.0064). ns/other's pod is on a node that stays up anyway: power only.
    by_function = {w.function: w.reason for w in result.warm}
    assert not by_function["ns/other"].paid
    assert ("ns/lone" in by_function) is warmed
    if warmed:
        assert by_function["ns/lone"].paid
        assert by_function["ns/lone"].cost_usd == pytest.approx(0.02)
    else:
        assert ("ns/lone", "cost exceeds benefit") in result.skipped


@pytest.mark.parametrize(
    ("busy_gpus", "warmed", "paid"),
    [(0, ["ns/crit", "ns/normal"], [False, False]), (1, ["ns/crit"], [False]), (2, ["ns/crit"], [True])],
)
def test_a_gpu_replica_pays_a_gpu_nodes_price_unless_a_node_that_stays_up_has_one_free(
    busy_gpus: int, warmed: list[str], paid: list[bool]
) -> None:
    # Two 2-GPU nodes at $4/h: `busy` stays up (it runs pods) with 2 - busy_gpus GPUs free,
    # `idle` would scale down. Two GPU functions as likely as each other, one critical.
    labels = {"kdrl.dev/hourly-price": "4"}
    gpu_node = {
        "cpu_allocatable": 8000,
        "memory_allocatable": 64 * GiB,
        "gpu_allocatable": 2,
        "labels": labels,
    }
    nodes = NodeTable.from_nodes(
        [
            Node(name="busy", gpu_requested=busy_gpus, memory_requested=40 * GiB, **gpu_node),  # type: ignore[arg-type]
            Node(name="idle", **gpu_node),  # type: ignore[arg-type]
        ]
    )
    settings = PlannerSettings(hybrid_memory_share=None, scale_down_utilization=0.5)
    assert free_gpu(nodes, scale_down_utilization=0.5) == 2 - busy_gpus
    gpu_pod = dataclasses.replace(state("x").pod, gpu=1)
    states = {
        "ns/crit": state("ns/crit", Priority.CRITICAL, pod=gpu_pod),
        "ns/normal": state("ns/normal", Priority.NORMAL, pod=gpu_pod),
    }
    forecasts = {f: forecast(f, probability=0.8) for f in states}
    result = plan(NOW, forecasts, states, nodes, PLENTY, policy=heuristics.kube_default(), settings=settings)
    # A free GPU on `busy` costs power only. Another would keep `idle` up at $2 per GPU-hour for
    # the fifth of three minutes the replica idles ($0.02): worth it to the critical function
    # (0.8 x 8 s x $0.01 = $0.064 of benefit), not to the normal one ($0.0064).
    assert [w.function for w in result.warm] == warmed
    assert [w.reason.paid for w in result.warm] == paid


def test_what_the_hybrid_holds_busy_still_buys_its_warmth() -> None:
    # The hybrid holds one function invoked every minute: it idles nothing, but the target is
    # counted as the planner counts its replicas (the floor), so the planner may hold it too.
    busy = forecast("ns/busy", probability=1.0)
    result = run([busy], [state("ns/busy")], hybrid_memory_share=1.0)
    assert [w.function for w in result.warm] == ["ns/busy"]


def test_the_cold_start_priced_is_the_median_of_those_observed_and_the_default_before_any() -> None:
    assert cold_start_estimate(()) == DEFAULT_COLD_START_S
    # One pod that waited a minute for a node moves the estimate little; a mean would be 14.6 s.
    assert cold_start_estimate([3.0, 4.0, 60.0, 2.5, 3.5]) == 3.5


def test_the_planner_benchs_cluster_runs_the_planned_functions_pods() -> None:
    # `python -m bench.planner` times the allocation; it must weigh the planned functions' own
    # pods (`nodes_kept_up`), not pods of functions it never plans for.
    names = [f"ns/f{i}" for i in range(50)]
    table = planner_bench.cluster(8, names)
    running = set(table.cluster.function_index)
    assert running and running <= set(names)
