"""Cluster mode: cold-start accounting on small cases, determinism, aggregate vs per request."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from policies import filtering, heuristics
from policies.objectives import PRIORITY_WEIGHT
from policies.types import Node, NodeTable, PodRequest, Priority
from simulator import clusterspec, engine, keepalive, nodes, report, traces
from simulator.workload import FunctionSpec, Workload

MiB = 1 << 20


def one_function(**changes: object) -> Workload:
    spec = FunctionSpec(
        service="default/fn",
        revision="fn-00001",
        image="registry.example.com/fn:1",
        image_bytes=400 * MiB,
        cpu_milli=250,
        memory_bytes=256 * MiB,
        gpu=0,
        concurrency_target=100.0,
        priority=Priority.HIGH,
    )
    spec = dataclasses.replace(spec, **changes)  # type: ignore[arg-type]
    return Workload(
        functions=(spec,), duration_ms=np.array([[100, 100, 100, 100, 100, 100, 100]], dtype=float)
    )


def simulate(
    counts: dict[int, int],
    policy: str = "knative",
    minutes: int = 30,
    seed: int = 1,
    workload: Workload | None = None,
) -> engine.RunResult:
    row = np.zeros((1, minutes), dtype=np.int64)
    for minute, count in counts.items():
        row[0, minute] = count
    return simulation(row, policy, seed=seed, workload=workload).run()


def simulation(
    counts: np.ndarray,
    policy: str = "knative",
    *,
    cluster: clusterspec.ClusterSpec | None = None,
    seed: int = 1,
    workload: Workload | None = None,
    warmup_minutes: int = 0,
) -> engine.Simulation:
    """A simulation of `counts` under kube-default placement, on `cluster` (default `small`)."""
    return engine.Simulation(
        workload=workload or one_function(),
        counts=counts,
        cluster=cluster or clusterspec.load("small"),
        placement=heuristics.kube_default(),
        keepalive=keepalive.by_name(policy),
        seed=seed,
        warmup_minutes=warmup_minutes,
    )


def test_scale_from_zero_only_when_the_revision_has_gone_to_zero() -> None:
    # One request in minutes 0, 1 (within the ~90 s the KPA keeps the pod) and 10.
    result = simulate({0: 1, 1: 1, 10: 1})
    assert (result.invocations[0], result.cold_starts[0]) == (3, 2)


# The hybrid histogram, having seen one idle time of a minute, keeps the instance for about a
# minute after minute 1 (as in study mode): minute 10 is cold.
@pytest.mark.parametrize(("policy", "cold"), [("fixed:20", 1), ("hybrid", 2), ("fixed:5", 2)])
def test_keepalive_policies_act_through_min_scale(policy: str, cold: int) -> None:
    assert simulate({0: 1, 1: 1, 10: 1}, policy=policy).cold_starts[0] == cold


def test_cold_start_latency_is_pull_plus_start() -> None:
    result = simulate({0: 1})
    startup = engine.StartupConfig()
    pull = 400 * MiB / (40 * MiB)  # small.yaml's general pool pulls 40 MiB/s
    expected = startup.scheduling_s + pull + startup.container_start_s + startup.runtime_init_s
    hist = result.latency_hist[Priority.HIGH]
    (bin_,) = np.flatnonzero(hist)
    assert (
        abs((bin_ + 0.5) * engine.LATENCY_BIN_S - expected) <= 0.5 + engine.LATENCY_BIN_S
    )  # arrival within its second
    assert result.pulls == 1


def test_second_cold_start_on_the_same_node_skips_the_pull() -> None:
    result = simulate({0: 1, 20: 1})
    assert result.cold_starts[0] == 2 and result.pulls == 1


def test_deterministic_for_a_seed() -> None:
    trace = traces.load(traces.Path(__file__).parent.parent / "simulator" / "data" / "azure2019_slice")
    small = trace.subset(list(range(0, 338, 20))).window(0, 30)
    from simulator import workload

    def run(seed: int) -> dict[str, object]:
        result = engine.Simulation(
            workload=workload.build(small, seed=seed),
            counts=small.counts,
            cluster=clusterspec.load("small"),
            placement=heuristics.kube_default(),
            keepalive=keepalive.by_name("hybrid"),
            seed=seed,
        ).run()
        return report.cluster_entry(result, small.weights, 1800.0)

    assert run(3) == run(3)
    assert run(3) != run(4)


class PerRequest:
    """A per-request reference for one revision with sparse traffic: requests at exact times,
    a pod ready `startup` after the first request that finds none, and gone once no request
    has arrived for the KPA's stable window plus grace period (give or take its 2-s tick)."""

    def __init__(self, startup: float, idle_limit: float) -> None:
        self.startup, self.idle_limit = startup, idle_limit

    def cold_starts(self, arrivals: list[float]) -> int:
        cold, ready_at, last = 0, None, -1e9
        for t in arrivals:
            if ready_at is None or t - last > self.idle_limit:
                ready_at = t + self.startup
            if t < ready_at:
                cold += 1
            last = t
        return cold


def test_aggregate_agrees_with_per_request_on_a_small_case() -> None:
    # Bursts far apart (or close together) so the KPA's 2-s tick cannot tip any decision.
    minutes = {0: 5, 1: 3, 6: 8, 7: 2, 8: 1, 15: 4, 25: 6}
    counts = np.zeros((1, 30), dtype=np.int64)
    for minute, count in minutes.items():
        counts[0, minute] = count

    class Exact(engine.Simulation):
        def _arrivals(self, minute: int) -> np.ndarray:
            per_second = super()._arrivals(minute)
            self.recorded.extend(minute * 60 + s + 0.5 for s in np.repeat(np.arange(60), per_second[0]))
            return per_second

    simulation = Exact(
        workload=one_function(image_bytes=MiB),
        counts=counts,
        cluster=clusterspec.load("small"),
        placement=heuristics.kube_default(),
        keepalive=keepalive.by_name("knative"),
        seed=7,
    )
    simulation.recorded = []  # type: ignore[attr-defined]
    aggregate = simulation.run()
    arrivals = simulation.recorded  # type: ignore[attr-defined]
    startup = engine.StartupConfig()
    pod_start = startup.scheduling_s + MiB / (40 * MiB) + startup.container_start_s + startup.runtime_init_s
    reference = PerRequest(startup=pod_start, idle_limit=90.0)
    assert aggregate.cold_starts[0] == reference.cold_starts(arrivals)
    assert aggregate.cold_starts[0] >= 3  # the case does exercise scale-from-zero


def test_new_revisions_start_with_initial_scale_and_then_scale_to_zero() -> None:
    simulation = engine.Simulation(
        workload=one_function(),
        counts=np.zeros((1, 5), dtype=np.int64),
        cluster=clusterspec.load("small"),
        placement=heuristics.kube_default(),
        keepalive=keepalive.by_name("knative"),
        seed=1,
        new_revisions=True,
    )
    decisions: list[engine.Decision] = []

    def first_feasible(decision: engine.Decision) -> int:
        decisions.append(decision)
        return int(np.flatnonzero(decision.feasible)[0])

    result = engine.drive(simulation.steps(), first_feasible)
    assert [(d.function, d.now) for d in decisions] == [(0, 0.0)]  # initial-scale 1, at once
    assert result.pods_started == 1 and simulation.current[0] == 0  # gone after the grace period


def test_windows_after_an_invocation_replace_the_earlier_ones() -> None:
    # A policy whose window after the first invocation is long and after the second is short:
    # the short one rules from the second invocation on, so minute 20 is cold again.
    class LongThenShort:
        name = "long-then-short"

        def windows(self, gaps: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            keepalive = np.where(np.arange(gaps.size) == 0, 60.0, 1.0)
            return np.zeros(gaps.size), keepalive

    row = np.zeros((1, 30), dtype=np.int64)
    row[0, [0, 2, 20]] = 1
    result = engine.Simulation(
        workload=one_function(),
        counts=row,
        cluster=clusterspec.load("small"),
        placement=heuristics.kube_default(),
        keepalive=LongThenShort(),
        seed=1,
    ).run()
    assert result.cold_starts[0] == 2  # minute 0 and minute 20; minute 2 was warm


def test_requests_for_a_pod_that_never_fits_time_out_in_the_activator() -> None:
    # Two GPUs per pod: no pool of `small` has them, so no pod ever starts.
    result = simulate({0: 1, 10: 1}, workload=one_function(gpu=2))
    weight = PRIORITY_WEIGHT[Priority.HIGH]
    assert result.timed_out[Priority.HIGH] == 2
    assert result.meters.weighted_cold_s == pytest.approx(2 * weight * engine.REQUEST_TIMEOUT_S)
    assert result.meters.weighted_sla_violations == 2 * weight
    hist = result.latency_hist[Priority.HIGH]
    assert np.flatnonzero(hist).tolist() == [int(engine.REQUEST_TIMEOUT_S / engine.LATENCY_BIN_S)]


def test_a_request_served_before_the_timeout_is_not_timed_out() -> None:
    result = simulate({0: 1})
    assert sum(result.timed_out.values()) == 0 and result.latency_hist[Priority.HIGH].sum() == 1


def test_a_cold_start_is_split_into_its_wait_for_capacity_and_its_start_up(tmp_path: Path) -> None:
    # No node at first: the pod waits for the autoscaler's new node, then pulls and starts.
    spec = tmp_path / "empty.yaml"
    spec.write_text(
        "name: empty\npools:\n  - {name: a, count: 0, min: 0, max: 1, cpu: 8, memory_gib: 32, "
        "on_demand_per_hour: 0.38, spot_per_hour: 0.11, pull_mib_per_s: 40, "
        "power: {model: linear, idle_watts: 100, max_watts: 250}}\n"
    )
    row = np.zeros((1, 5), dtype=np.int64)
    row[0, 0] = 1
    result = simulation(row, cluster=clusterspec.load(str(spec))).run()
    startup = engine.StartupConfig()
    start_up = startup.scheduling_s + 400 / 40 + startup.container_start_s + startup.runtime_init_s
    (capacity_bin,) = np.flatnonzero(result.capacity_hist)
    (startup_bin,) = np.flatnonzero(result.startup_hist)
    # The request arrived within its second; the node joined after PROVISIONING_S, and the
    # pending pod was placed at the next 10-s retry at or after that.
    capacity = (capacity_bin + 0.5) * engine.LATENCY_BIN_S
    assert nodes.PROVISIONING_S - 1.0 <= capacity <= nodes.PROVISIONING_S + engine.METRICS_EVERY_S
    assert (startup_bin + 0.5) * engine.LATENCY_BIN_S == pytest.approx(start_up, abs=engine.LATENCY_BIN_S)
    (total_bin,) = np.flatnonzero(result.latency_hist[Priority.HIGH])
    assert abs(total_bin - capacity_bin - startup_bin) <= 1


def test_equal_scores_are_broken_at_random_as_kube_scheduler_does() -> None:
    table, _ = nodes.Nodes(clusterspec.load("small")).table(0.0)
    pod = engine.pod_request(one_function().functions[0])
    feasible = filtering.filter_nodes(pod, table, explain=False).feasible
    decision = engine.Decision(now=0.0, function=0, pod=pod, nodes=table, feasible=feasible)
    policy = heuristics.kube_default()
    assert engine.best_row(policy, decision) == int(np.flatnonzero(feasible)[0])  # no generator: the first
    ties = np.random.default_rng(3)
    picked = {engine.best_row(policy, decision, ties) for _ in range(60)}
    assert len(picked) >= 5 and all(feasible[row] for row in picked)  # every empty node ties


def test_ties_are_broken_by_the_default_plugins_the_deployed_scheduler_keeps() -> None:
    # Two nodes the policy cannot tell apart: kube-scheduler's default plugins, which break the
    # extender's ties, prefer the emptier one whatever the random draw.
    gib = 1 << 30
    busy = Node(
        name="busy",
        cpu_allocatable=4000,
        memory_allocatable=16 * gib,
        cpu_requested=3000,
        memory_requested=12 * gib,
        cpu_nonzero_requested=3000,
        memory_nonzero_requested=12 * gib,
        pod_count=3,
    )
    idle = Node(name="idle", cpu_allocatable=4000, memory_allocatable=16 * gib)
    table = NodeTable.from_nodes([busy, idle])
    pod = PodRequest(namespace="ns", name="p", cpu_milli=250, memory_bytes=256 << 20)
    decision = engine.Decision(now=0.0, function=0, pod=pod, nodes=table, feasible=np.ones(2, dtype=bool))
    blind = heuristics.weighted("images-only", {"ImageLocality": 1.0})  # no node holds the image
    assert not np.ptp(blind.score(pod, table))
    ties = np.random.default_rng(0)
    assert {engine.best_row(blind, decision, ties) for _ in range(20)} == {1}
    # No tie: the policy's own choice stands against the default plugins.
    assert engine.best_row(heuristics.most_allocated_policy(), decision, ties) == 0


def _one_node_cluster(tmp_path: Path, minimum: int) -> clusterspec.ClusterSpec:
    spec = tmp_path / "one.yaml"
    spec.write_text(
        f"name: one\npools:\n  - {{name: a, count: 1, min: {minimum}, max: 1, cpu: 8, memory_gib: 32, "
        "on_demand_per_hour: 0.38, spot_per_hour: 0.11, pull_mib_per_s: 40, "
        "power: {model: linear, idle_watts: 100, max_watts: 250}}\n"
    )
    return clusterspec.load(str(spec))


@pytest.mark.parametrize(
    ("minimum", "busy_neighbour", "paid"), [(0, False, True), (1, False, False), (0, True, False)]
)
def test_idle_memory_is_paid_only_where_it_alone_keeps_a_node_up(
    tmp_path: Path, minimum: int, busy_neighbour: bool, paid: bool
) -> None:
    # A function invoked once and then held warm 20 minutes, alone on the only node of a pool
    # that may shrink to `minimum`, or beside a function with requests every second.
    kept = one_function(service="default/kept")
    functions = [kept.functions[0]]
    minutes = 20
    counts = np.zeros((1, minutes), dtype=np.int64)
    counts[0, 0] = 1
    if busy_neighbour:
        functions.append(dataclasses.replace(functions[0], service="default/busy", image="busy:1"))
        counts = np.vstack([counts, np.full((1, minutes), 1200)])
    durations = np.repeat(kept.duration_ms, len(functions), axis=0)
    workload = Workload(functions=tuple(functions), duration_ms=durations)
    result = simulation(
        counts, "fixed:20", cluster=_one_node_cluster(tmp_path, minimum), workload=workload
    ).run()
    wasted, paid_s = result.wasted_mb_s[0], result.paid_wasted_mb_s[0]
    assert wasted > 15 * 60 * 256  # idle for most of the 20 minutes
    if paid:  # metered every 10 s, the total every second: the same to within a sample or two
        assert abs(paid_s - wasted) <= 2 * engine.METRICS_EVERY_S * 256
    else:
        assert paid_s == 0.0


def test_the_warmup_runs_but_is_not_counted() -> None:
    # Cold at minute 0 (the start from zero) and again at minute 12, past Knative's idle time.
    row = np.zeros((1, 20), dtype=np.int64)
    row[0, [0, 12]] = 1

    whole, counted = simulation(row).run(), simulation(row, warmup_minutes=5).run()
    assert (whole.invocations[0], whole.cold_starts[0]) == (2, 2)
    assert (counted.invocations[0], counted.cold_starts[0]) == (1, 1)
    assert counted.startup_hist.sum() == 1 and counted.latency_hist[Priority.HIGH].sum() == 1
    assert len(counted.series["minute"]) == 15 and counted.series["minute"][0] == 5.0
    # The first pull (minute 0) is the warm-up's; its node kept the image for minute 12.
    assert (whole.pulls, counted.pulls) == (1, 0)
    assert 0 < counted.cost_usd < whole.cost_usd and 0 < counted.energy_j < whole.energy_j


def test_cost_and_energy_are_split_by_pool_and_into_being_up_and_the_pods_cpu(tmp_path: Path) -> None:
    # Pool `kept` holds at its minimum of one node, where the function's pod runs; `drained`
    # has one node the pod may not use (a taint), which is released after ten empty minutes.
    spec = tmp_path / "two.yaml"
    node = "cpu: 8, memory_gib: 32, spot_per_hour: 0.1, pull_mib_per_s: 40"
    spec.write_text(
        "name: two\npools:\n"
        f"  - {{name: kept, count: 1, min: 1, max: 1, on_demand_per_hour: 0.4, {node}, "
        "power: {model: linear, idle_watts: 100, max_watts: 260}}\n"
        f"  - {{name: drained, count: 1, min: 0, max: 1, on_demand_per_hour: 0.2, {node}, "
        "taints: [{key: dedicated, value: other, effect: NoSchedule}], "
        "power: {model: linear, idle_watts: 50, max_watts: 150}}\n"
    )
    minutes = 30
    counts = np.zeros((1, minutes), dtype=np.int64)
    counts[0, 0] = 1
    # the pod stays throughout
    result = simulation(counts, f"fixed:{minutes}", cluster=clusterspec.load(str(spec))).run()
    assert result.pools == ("kept", "drained")
    tick = engine.METRICS_EVERY_S
    kept, drained = 0, 1
    # Up the whole run. Its pod (the function and its queue-proxy) adds (260 - 100) W x its share
    # of the 8,000 millicores while it starts and serves its one request, within the first
    # minute, and nothing for the 29 minutes it then idles warm: power follows CPU in use.
    assert result.pool_up_energy_j[kept] == pytest.approx(100 * minutes * 60, abs=100 * tick)
    pod_watts = 160 * engine.pod_request(one_function().functions[0]).cpu_milli / 8000
    pods_cpu = result.pool_energy_j[kept] - result.pool_up_energy_j[kept]
    assert pod_watts * tick <= pods_cpu <= pod_watts * 60
    # Up only until the autoscaler released it, with nothing allocated.
    up_s = nodes.SCALE_DOWN_UNNEEDED_S
    assert result.pool_energy_j[drained] == result.pool_up_energy_j[drained]
    assert result.pool_energy_j[drained] == pytest.approx(50 * up_s, abs=50 * tick)
    assert result.pool_cost_usd[drained] == pytest.approx(0.2 * up_s / 3600, abs=0.2 * tick / 3600)
    by_pool = report.cluster_entry(result, np.ones(1), minutes * 60.0)["by_pool"]
    assert by_pool["drained"]["energy_kwh"] == by_pool["drained"]["energy_kwh_nodes_up"] > 0
    assert by_pool["kept"]["energy_kwh"] > by_pool["kept"]["energy_kwh_nodes_up"]


def test_each_pods_creation_to_ready_time_is_recorded_for_its_function() -> None:
    row = np.zeros((1, 30), dtype=np.int64)
    row[0, [0, 20]] = 1  # two cold starts: the first pulls the image, the second finds it
    run = simulation(row)
    run.run()
    startup = engine.StartupConfig()
    start = startup.scheduling_s + startup.container_start_s + startup.runtime_init_s
    pull = 400 * MiB / (40 * MiB)  # small.yaml's general pool pulls 40 MiB/s
    first, second = run.startups_s[0]
    assert first == pytest.approx(start + pull) and second == pytest.approx(start)


def test_the_first_start_of_each_function_is_told_apart_from_its_later_cold_starts() -> None:
    # Minute 0: the first start pulls the image; minute 20: a cold start that finds it.
    row = np.zeros((1, 30), dtype=np.int64)
    row[0, [0, 20]] = 1
    result = simulation(row).run()
    assert result.startup_hist.sum() == 2 and result.first_start_hist.sum() == 1
    entry = report.cluster_entry(result, np.ones(1), 30 * 60.0)
    startup = engine.StartupConfig()
    start = startup.scheduling_s + startup.container_start_s + startup.runtime_init_s
    pull = 400 * MiB / (40 * MiB)
    # Within a second: a request arrives within its minute's second, the pod is asked for on it.
    assert entry["cold_start_latency_p99_s"] == pytest.approx(start + pull, abs=1.0)
    assert entry["cold_start_latency_p99_s_first_starts_out"] == pytest.approx(start, abs=1.0)
    # Counted from the warm-up's end, the first start is the warm-up's: nothing of it is left.
    counted = simulation(row, warmup_minutes=5).run()
    assert counted.startup_hist.sum() == 1 and counted.first_start_hist.sum() == 0


def _two_node_cluster(tmp_path: Path) -> clusterspec.ClusterSpec:
    spec = tmp_path / "two.yaml"
    spec.write_text(
        "name: two\npools:\n  - {name: a, count: 2, min: 0, max: 2, cpu: 8, memory_gib: 32, "
        "on_demand_per_hour: 0.38, spot_per_hour: 0.11, pull_mib_per_s: 40, "
        "power: {model: linear, idle_watts: 100, max_watts: 250}}\n"
    )
    return clusterspec.load(str(spec))


def _busy_run(tmp_path: Path, *cpu_milli: int, drain: bool) -> engine.Simulation:
    """25 minutes of functions called every second (one pod each, never idle), with these CPU
    requests, on two 8-core nodes under kube-default placement."""
    base = one_function().functions[0]
    functions = tuple(
        dataclasses.replace(base, service=f"default/f{i}", image=f"f{i}:1", cpu_milli=cpu)
        for i, cpu in enumerate(cpu_milli)
    )
    return engine.Simulation(
        workload=Workload(
            functions=functions, duration_ms=np.repeat(one_function().duration_ms, len(functions), axis=0)
        ),
        counts=np.full((len(functions), 25), 60),
        cluster=_two_node_cluster(tmp_path),
        placement=heuristics.kube_default(),
        keepalive=keepalive.by_name("knative"),
        seed=1,
        drain_underused=drain,
    )


def test_the_autoscaler_drains_a_node_under_half_allocated_when_its_pods_fit_elsewhere(
    tmp_path: Path,
) -> None:
    # Two busy pods, spread by kube-default onto both nodes, each node 3 % allocated. The real
    # cluster autoscaler moves one pod after 10 minutes and removes its node; with `drain`
    # off, the simulator releases empty nodes only.
    runs = {drain: _busy_run(tmp_path, 250, 250, drain=drain) for drain in (False, True)}
    kept, drained = (runs[drain].run() for drain in (False, True))
    assert (kept.evictions, drained.evictions) == (0, 1)
    assert (kept.series["nodes"][-1], drained.series["nodes"][-1]) == (2, 1)
    assert runs[True].current.tolist() == [1, 1]  # the evicted pod was created again
    assert runs[True].nodes.pod_count[runs[True].nodes.alive].tolist() == [2]
    # The moved function went cold while its new pod started (its only pod was evicted).
    assert drained.cold_starts.sum() > kept.cold_starts.sum()
    assert drained.cost_usd < kept.cost_usd


def test_a_node_whose_pods_fit_nowhere_else_is_not_drained(tmp_path: Path) -> None:
    # 3.9 cores alone on one node (under half), 4.2 on the other (3.8 free): nothing moves.
    run = _busy_run(tmp_path, 3900, 3900, 300, drain=True)
    result = run.run()
    # with queue-proxy's 25 m each
    assert sorted(run.nodes.cpu_requested[run.nodes.alive].tolist()) == [3925, 4250]
    assert result.evictions == 0


def test_a_busy_pod_draws_its_cpu_share_of_the_nodes_dynamic_power(tmp_path: Path) -> None:
    # Requests of 20 s every few seconds: the one pod is never idle once up. Its node draws
    # (250 - 100) W x the pod's share of its 8,000 millicores, beside both nodes' 100 W.
    busy = dataclasses.replace(one_function(), duration_ms=np.full((1, 7), 20_000.0))
    result = simulation(np.full((1, 25), 20), workload=busy, cluster=_two_node_cluster(tmp_path)).run()
    pod_watts = 150 * engine.pod_request(busy.functions[0]).cpu_milli / 8000
    pods_cpu = float(result.pool_energy_j.sum() - result.pool_up_energy_j.sum())
    assert pod_watts * 24 * 60 <= pods_cpu <= pod_watts * 25 * 60
