"""Cluster mode: a Knative cluster driven by a trace, one second at a time.

Per revision, requests arrive each second (the trace's per-minute count spread over the minute
by a seeded multinomial: a Poisson process given its count) and stay in flight for a duration
drawn from the function's percentiles. Busy functions are thereby simulated in aggregate
(per-second arrivals and concurrency); cold-start accounting is per request all the same: a
request that finds no ready pod waits in the activator until one is ready, and that wait is
its cold start (or the request timeout, when the activator gives up first). The KPA
(`knative`) turns concurrency into desired pods; keep-alive policies act as Knative operators
would, by raising `min-scale` over the windows they choose.

A new pod is placed by the `PlacementPolicy` through the shared filter, like the extender
does, and starts after: scheduling, the image pull when the node lacks the image, container
start and runtime init (`StartupConfig`). Nodes come and go with the autoscaler (`nodes`).
Deterministic for a seed; the only wall-clock reading is the policy's decision time, which is
reported apart (`RunResult.decision_us`).
"""

from __future__ import annotations

import copy
import heapq
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Protocol

import numpy as np
import numpy.typing as npt

from forecaster.history import Lifecycle
from policies import filtering, heuristics, placement
from policies.objectives import PRIORITY_WEIGHT, SLA_TARGET_S
from policies.placement import PlacementPolicy
from policies.types import BoolArray, NodeTable, PodRequest, Priority, Toleration
from prewarm.planning import PrewarmPlan
from simulator import study
from simulator.clusterspec import ClusterSpec
from simulator.keepalive import KeepAlivePolicy
from simulator.knative import Autoscaler, AutoscalerConfig
from simulator.nodes import PROVISIONING_S, Nodes
from simulator.workload import FunctionSpec, Workload

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
MiB = 1024 * 1024
QUEUE_PROXY_IMAGE = "gcr.io/knative-releases/knative.dev/serving/cmd/queue@sha256:queue-proxy"
QUEUE_PROXY_BYTES = 30 * MiB  # pulled by every node when Knative is installed
QUEUE_PROXY_CPU_MILLI = 25  # queue-proxy's default CPU request
COMPLETION_RING_S = 3600  # longest modelled request; longer ones are cut to an hour
METRICS_EVERY_S = 10
# How long a pod's wait for room counts as caused by placement: a new node's join time, plus
# one metering step for the pod to be placed once it has joined.
SCALE_UP_WAIT_S = PROVISIONING_S + METRICS_EVERY_S
LATENCY_BIN_S = 0.05
LATENCY_BINS = 24_000  # 0..1200 s
# Knative's `revision-timeout-seconds` default: a request still buffered in the activator after
# this long fails (504). Without it, a pod that cannot be placed for hours would make each of its
# requests wait hours, and those few waits would drown every other start delay in the totals.
REQUEST_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class StartupConfig:
    """Pod start, beyond the image pull. A cached helloworld scales from zero in 2-4 s
    (knative/serving issues, kperf; baselines.md), and the pod-startup SLO excluding pulls is
    p99 <= 5 s (sig-scalability): we take 2.5 s for container start plus runtime init."""

    scheduling_s: float = 0.05  # scheduler cycle with an HTTP extender (~1 ms here) and the bind
    container_start_s: float = 1.0  # sandbox and container creation
    runtime_init_s: float = 1.5  # language runtime and queue-proxy readiness


@dataclass(slots=True)
class _Pod:
    function: int
    node: int
    ready_at: float
    created_at: float  # when the autoscaler asked for it
    placed_at: float  # when a node had room for it: the wait before is a capacity wait
    pull_s: float = 0.0  # how long its image kept it from starting (0: the image was there)
    alive: bool = True
    ready: bool = False


class _PodColumns:
    """Every pod's function, node and state as arrays in creation order, beside `_Pod`, so that
    the paid-idle meter reads them vectorised every 10 s instead of walking the pods."""

    GONE, STARTING, READY = 0, 1, 2

    def __init__(self) -> None:
        self.function = np.zeros(256, dtype=np.int64)
        self.node = np.zeros(256, dtype=np.int64)
        self.state = np.zeros(256, dtype=np.int8)
        self.size = 0

    def add(self, function: int, node: int) -> None:
        if self.size == len(self.state):
            self.function, self.node, self.state = (
                np.concatenate([a, np.zeros_like(a)]) for a in (self.function, self.node, self.state)
            )
        self.function[self.size], self.node[self.size], self.state[self.size] = function, node, self.STARTING
        self.size += 1


@dataclass(frozen=True, slots=True)
class _PodActivity:
    """Every live pod, in creation order: its function, its node, and whether it sits idle."""

    function: IntArray
    node: IntArray
    idle: BoolArray


@dataclass(frozen=True, slots=True)
class Decision:
    """One pod to place: the ready nodes, which of them can run it (the shared filter), when."""

    now: float
    function: int
    pod: PodRequest
    nodes: NodeTable
    feasible: BoolArray


class Prewarmer(Protocol):
    """Plans warm capacity and image pre-pulls at the start of each minute (`prewarm.planning`)."""

    def plan(
        self, minute: int, counts: IntArray, nodes: NodeTable, startups_s: Sequence[Sequence[float]]
    ) -> PrewarmPlan:
        """`counts`: every function's invocations per minute, of the minutes before `minute`;
        `startups_s`: each function's latest creation-to-ready times, as the service observes them."""


# A run as a coroutine: it yields each placement decision and is sent back the chosen row.
Steps = Generator[Decision, int, "RunResult"]


@dataclass(slots=True)
class Meters:
    """Running totals of what placement influences, for rewards taken between decisions."""

    weighted_cold_s: float = 0.0  # cold-start seconds x the class's priority weight
    weighted_pull_s: float = 0.0  # seconds new pods wait for their image x priority weight
    # seconds requests wait for an image pulled for the pod that serves them x priority weight:
    # a pull for a function with many requests waiting costs that many times more
    weighted_request_pull_s: float = 0.0
    # seconds pods wait for a node with room (the autoscaler adding one) x priority weight,
    # accrued while they wait: what packing costs when a burst finds the cluster drained
    weighted_capacity_s: float = 0.0
    # the part of those a placement can cause: pods a node is being added for, up to the time a
    # new node takes to join (a pod no pool can grow for waits whatever was placed)
    weighted_scale_up_wait_s: float = 0.0
    weighted_sla_violations: float = 0.0  # requests over their class's SLA x priority weight
    utilization_s: float = 0.0  # CPU allocation share of existing nodes x seconds


# The totals of a RunResult that leave the warm-up out (counted from its end).
COUNTED_AFTER_WARMUP = (
    "cold_starts",
    "wasted_mb_s",
    "paid_wasted_mb_s",
    "startup_hist",
    "first_start_hist",
    "capacity_hist",
    "pulls",
    "prepulls",
    "pods_started",
    "evictions",
    "pool_energy_j",
    "pool_up_energy_j",
    "pool_cost_usd",
)


@dataclass
class RunResult:
    """Everything `report` needs, as plain arrays and numbers."""

    invocations: IntArray  # per function
    cold_starts: IntArray  # per function: requests that found no ready pod
    wasted_mb_s: FloatArray  # per function: memory of idle ready pods over time
    # per function: the part of `wasted_mb_s` that keeps a node up, i.e. costs node-hours (idle
    # pods alone on a node the pool could release without them); the rest sits in room that
    # nodes kept up by busy pods have anyway, and costs idle power only
    paid_wasted_mb_s: FloatArray
    latency_hist: dict[Priority, FloatArray]  # start-delay histograms of cold requests per class
    # The start delay of each cold request that a pod served, in two parts: waiting for a node
    # with room (capacity), and the rest (scheduling, image pull, container start, runtime init).
    startup_hist: FloatArray
    capacity_hist: FloatArray
    # The part of `startup_hist` served by each function's first pod of the run: nothing of the
    # function has run before it, so no node holds its image unless pre-pulled (caches start empty).
    first_start_hist: FloatArray
    warm_requests: dict[Priority, int]
    timed_out: dict[Priority, int]  # requests the activator gave up on (counted in latency_hist too)
    pulls: int  # image pulls for pods being placed (their start waits for them)
    prepulls: int  # image pulls the prewarm planner asked for ahead of any pod
    pods_started: int
    # per pool of the cluster spec (`pools`, by name): its energy, the part its nodes draw for
    # being up (idle; the rest is the CPU its busy and starting pods use), and its cost
    pools: tuple[str, ...]
    pool_energy_j: FloatArray
    pool_up_energy_j: FloatArray
    pool_cost_usd: FloatArray
    series: dict[str, list[float]]  # per minute: nodes, cpu/memory allocation, watts
    decision_us: list[float] = field(default_factory=list)
    meters: Meters = field(default_factory=Meters)
    evictions: int = 0  # pods moved off nodes the cluster autoscaler drained (`drain_underused`)

    @property
    def energy_j(self) -> float:
        return float(self.pool_energy_j.sum())

    @property
    def cost_usd(self) -> float:
        return float(self.pool_cost_usd.sum())


def pod_request(spec: FunctionSpec) -> PodRequest:
    namespace = spec.service.split("/", 1)[0]
    cpu = spec.cpu_milli + QUEUE_PROXY_CPU_MILLI
    return PodRequest(
        namespace=namespace,
        name=f"{spec.revision}-deployment",
        function=spec.service,
        revision=spec.revision,
        priority=spec.priority,
        cpu_milli=cpu,
        memory_bytes=spec.memory_bytes,
        gpu=spec.gpu,
        cpu_milli_nonzero=cpu,
        memory_bytes_nonzero=spec.memory_bytes,
        images=(spec.image, QUEUE_PROXY_IMAGE),
        tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists"),) if spec.gpu else (),
    )


class Simulation:
    """One run: a workload on a cluster under a placement and a keep-alive policy."""

    def __init__(
        self,
        *,
        workload: Workload,
        counts: IntArray,
        cluster: ClusterSpec,
        placement: PlacementPolicy,
        keepalive: KeepAlivePolicy,
        seed: int,
        autoscaler: AutoscalerConfig | None = None,
        startup: StartupConfig | None = None,
        new_revisions: bool = False,
        prewarmer: Prewarmer | None = None,
        warmup_minutes: int = 0,
        drain_underused: bool = False,
    ) -> None:
        """`new_revisions`: the revisions are created as the run starts, each with its
        `initial_scale` pods; otherwise they exist already, scaled to zero (a day's trace).
        `prewarmer`: raises `min-scale` and pre-pulls images each minute, on top of `keepalive`.
        `warmup_minutes`: run but not counted in the result (its invocations, cold starts, waits,
        memory, cost, energy, pulls, series, meters): a run starts with every revision at zero and
        every image cache empty at once, a burst of cold starts and pulls no running cluster sees.
        `drain_underused`: the cluster autoscaler also drains nodes under half allocated whose
        pods fit elsewhere, as the real one does (the placement protocol's ground,
        `evaluation.DRAIN_UNDERUSED`); off, it releases only empty nodes, the prewarm benches'
        ground (docs/simulator-fidelity.md)."""
        self.workload, self.counts, self.placement = workload, counts, placement
        self.startup = startup or StartupConfig()
        self.rng = np.random.default_rng(seed)
        self.ties = np.random.default_rng([seed, 1])  # kube-scheduler's pick among equal scores
        self.functions = workload.functions
        n = len(self.functions)
        self.requests = [pod_request(f) for f in self.functions]
        self.pod_cpu_milli = np.array([r.cpu_milli for r in self.requests], dtype=np.float64)
        self.image_of = {f.service: f.image for f in self.functions}
        self.memory_mb = np.array([f.memory_bytes / MiB for f in self.functions])
        self.targets = np.array([f.concurrency_target for f in self.functions])
        self.kpa = Autoscaler(self.targets, autoscaler or AutoscalerConfig())
        self.nodes = Nodes(cluster)
        for node in range(len(self.nodes.caches)):
            self.nodes.image_ready(node, QUEUE_PROXY_IMAGE, QUEUE_PROXY_BYTES, -1e12)
        self.pods: list[_Pod] = []
        self.pod_columns = _PodColumns()
        self.by_function: list[list[int]] = [[] for _ in range(n)]
        self.ready = np.zeros(n, dtype=np.int64)
        self.current = np.zeros(n, dtype=np.int64)
        self.inflight = np.zeros(n)
        self.completions = np.zeros((COMPLETION_RING_S, n))
        self.buffered: list[list[tuple[float, int]]] = [[] for _ in range(n)]
        self.waiting = np.zeros(n, dtype=np.bool_)  # has buffered requests
        self.has_started = np.zeros(n, dtype=np.bool_)  # has had a ready pod in this run
        self.priority_index = np.array(
            [list(Priority).index(f.priority) for f in self.functions], dtype=np.int64
        )
        self.warm_by_class = np.zeros(len(Priority), dtype=np.int64)
        self.pending: list[int] = []  # functions with a pod waiting for room
        self.pending_since: list[list[float]] = [[] for _ in range(n)]  # their creation times
        self.max_scale = np.array(
            [f.max_scale or np.iinfo(np.int64).max for f in self.functions], dtype=np.int64
        )
        self.room_changed = False  # a pod left or a node joined since pending pods last tried
        self._stuck_now: set[int] = set()
        self._no_room: set[int] = set()  # functions no node can be added for, until promises reset
        self.starting: list[tuple[float, int]] = []  # heap of (ready_at, pod id)
        # Each function's latest pod creation-to-ready times, kept as the service's Lifecycle keeps them
        self.startups_s = [deque[float](maxlen=Lifecycle.RECENT) for _ in range(n)]
        # The keep-alive window in force per function: min-scale 1 from `warm_from` until
        # `warm_until`. The windows chosen after an invocation replace those before it, as the
        # policies define them (SitW re-decides both windows after every invocation).
        self.warm_from = np.full(n, np.inf)
        self.warm_until = np.full(n, -np.inf)
        self.prewarmer = prewarmer
        self.planned_min_scale = np.zeros(n, dtype=np.int64)
        self.index_of = {spec.service: i for i, spec in enumerate(self.functions)}
        periods = study.IdlePeriods.from_counts(counts)
        self.prewarm, self.keepalive = keepalive.windows(periods.minutes, periods.offsets)
        self.next_period = periods.offsets[:-1].copy()
        priorities = list(Priority)
        self.result = RunResult(
            invocations=counts.sum(axis=1),
            cold_starts=np.zeros(n, dtype=np.int64),
            wasted_mb_s=np.zeros(n),
            paid_wasted_mb_s=np.zeros(n),
            latency_hist={p: np.zeros(LATENCY_BINS) for p in priorities},
            startup_hist=np.zeros(LATENCY_BINS),
            capacity_hist=np.zeros(LATENCY_BINS),
            first_start_hist=np.zeros(LATENCY_BINS),
            warm_requests=dict.fromkeys(priorities, 0),
            timed_out=dict.fromkeys(priorities, 0),
            pulls=0,
            prepulls=0,
            pods_started=0,
            pools=tuple(pool.name for pool in cluster.pools),
            pool_energy_j=np.zeros(len(cluster.pools)),
            pool_up_energy_j=np.zeros(len(cluster.pools)),
            pool_cost_usd=np.zeros(len(cluster.pools)),
            series={"minute": [], "nodes": [], "cpu_allocation": [], "memory_allocation": [], "watts": []},
        )
        self.new_revisions = new_revisions
        self.warmup_minutes = warmup_minutes
        self.drain_underused = drain_underused
        self.end_minute = counts.shape[1]  # the run ends after this minute (a lookahead's copy sets it)
        self._uncounted: tuple[RunResult, IntArray] | None = None  # the result at the warm-up's end

    def run(self) -> RunResult:
        """The whole run, each pod placed where the placement policy scores highest."""
        return drive(self.steps(), lambda decision: best_row(self.placement, decision, self.ties))

    def steps(self) -> Steps:
        """The run as a coroutine: whoever drives it (`run`, a learning environment) answers
        each `Decision` with a feasible row of its `nodes`."""
        if self.new_revisions:
            for function, spec in enumerate(self.functions):
                for _ in range(spec.initial_scale):
                    yield from self._create_pod(function, 0.0)
        minute = 0
        while minute < self.end_minute:
            if minute == self.warmup_minutes > 0:
                self._uncounted = copy.deepcopy(self.result), self.warm_by_class.copy()
            if self.prewarmer is not None:
                self._prewarm(minute)
            arrivals = self._arrivals(minute)
            hold = self._hold_seconds(arrivals)
            for second in range(60):
                yield from self._step(minute * 60 + second, arrivals[:, second], hold[:, second])
            self._open_windows(minute, arrivals)
            self._record_minute(minute)
            minute += 1
        self._finish(minute * 60.0)
        return self.result

    # -- one second -------------------------------------------------------------------
    def _arrivals(self, minute: int) -> IntArray:
        counts = self.counts[:, minute]
        per_second = self.rng.multinomial(counts, np.full(60, 1 / 60))
        return per_second

    def _hold_seconds(self, arrivals: IntArray) -> IntArray:
        """Whole seconds the requests of each (function, second) stay in flight: one duration
        draw per function and second, the minute's drawn at once (one numpy call, not 60)."""
        hold = np.zeros(arrivals.shape, dtype=np.int64)
        function, second = np.nonzero(arrivals)
        durations = self.workload.draw_durations_s(self.rng, function)
        hold[function, second] = np.clip(np.ceil(durations), 1, COMPLETION_RING_S - 1)
        return hold

    def _open_windows(self, minute: int, per_second: IntArray) -> None:
        """After the minute: each invoked function's new windows, from its last arrival. The old
        ones held until now; Knative keeps the pod for 90 s after that arrival regardless."""
        invoked = np.flatnonzero(per_second.sum(axis=1))
        last_second = 59 - np.argmax(per_second[invoked, ::-1] > 0, axis=1)
        for function, last in zip(invoked.tolist(), last_second.tolist()):
            self._open_window(function, minute * 60.0 + last + 0.5)

    def _open_window(self, function: int, last_arrival: float) -> None:
        """The keep-alive policy's windows after this invocation minute replace those in force."""
        period = self.next_period[function]
        self.next_period[function] += 1
        prewarm, keepalive = self.prewarm[period] * 60.0, self.keepalive[period] * 60.0
        self.warm_from[function] = last_arrival + prewarm if keepalive > 0 else np.inf
        self.warm_until[function] = last_arrival + prewarm + keepalive

    def _step(self, t: int, arrivals: IntArray, hold: IntArray) -> Generator[Decision, int, None]:
        now = float(t)
        self._stuck_now = set()  # functions whose pod found no room this second
        self._no_room = set()
        self._start_ready_pods(now + 0.5)
        self._time_out_requests(now)
        slot = t % COMPLETION_RING_S
        self.inflight -= self.completions[slot]
        self.completions[slot] = 0.0
        active = arrivals.nonzero()[0]
        if active.size:
            yield from self._admit(now, active, arrivals[active], hold[active])
        self.kpa.observe(self.inflight)
        idle_pods = self.ready - np.minimum(self.ready, np.ceil(np.round(self.inflight / self.targets, 9)))
        self.result.wasted_mb_s += idle_pods * self.memory_mb
        if t % self.kpa.config.tick_s == 0:
            yield from self._scale(now)
        if self.pending and (self.room_changed or t % METRICS_EVERY_S == 0):
            yield from self._place_pending(now)
        if t % METRICS_EVERY_S == 0:
            if self.drain_underused:
                yield from self._drain_one(now)
            self._account(now)

    def _admit(
        self, now: float, functions: IntArray, counts: IntArray, hold: IntArray
    ) -> Generator[Decision, int, None]:
        finish = (int(now) + hold) % COMPLETION_RING_S
        self.inflight[functions] += counts
        self.completions[finish, functions] += counts
        cold = self.ready[functions] == 0
        for function, count in zip(functions[cold].tolist(), counts[cold].tolist()):
            self.buffered[function].append((now + 0.5, count))
            self.waiting[function] = True
            self.result.cold_starts[function] += count
            if self.current[function] == 0:  # the activator pokes the autoscaler at once
                self.kpa.poke(np.array([function]))
                yield from self._create_pod(function, now)
        np.add.at(self.warm_by_class, self.priority_index[functions[~cold]], counts[~cold])

    def _prewarm(self, minute: int) -> None:
        """The planner's `min-scale` per function until the next plan, and its pre-pulls now."""
        assert self.prewarmer is not None
        now = minute * 60.0
        table, ids = self.nodes.table(now)
        planned = self.prewarmer.plan(minute, self.counts[:, :minute], table, self.startups_s)
        self.planned_min_scale[:] = 0
        for entry in planned.warm:
            self.planned_min_scale[self.index_of[entry.function]] = entry.replicas
        row_of = {str(name): row for row, name in enumerate(table.names)}
        for pull in planned.pulls:
            node = int(ids[row_of[pull.node]])
            spec = self.functions[self.index_of[pull.function]]
            if self.nodes.image_ready(node, spec.image, spec.image_bytes, now)[1]:
                self.result.prepulls += 1
                self.nodes.collect_images(node, self._images_in_use(node) | {spec.image})

    def _scale(self, now: float) -> Generator[Decision, int, None]:
        in_window = (self.warm_from <= now) & (now < self.warm_until)
        min_scale = np.maximum(in_window.astype(np.int64), self.planned_min_scale)
        desired = self.kpa.desired(now, self.ready, self.current, min_scale)
        desired = np.minimum(np.where(self.waiting, np.maximum(desired, 1), desired), self.max_scale)
        for function in (desired != self.current).nonzero()[0].tolist():
            change = int(desired[function] - self.current[function])
            for _ in range(change):
                yield from self._create_pod(function, now)
            for _ in range(-change):
                self._delete_pod(function, now)

    # -- pods -------------------------------------------------------------------------
    def _create_pod(self, function: int, now: float) -> Generator[Decision, int, None]:
        self.current[function] += 1
        if function in self._stuck_now:  # its pod before found no room: this one waits too
            self._request_node(function, now)
            self._wait_for_room(function, now)
        elif not (yield from self._place(function, now, created_at=now)):
            self._stuck_now.add(function)
            self._wait_for_room(function, now)

    def _wait_for_room(self, function: int, created_at: float) -> None:
        self.pending.append(function)
        self.pending_since[function].append(created_at)

    def _place(self, function: int, now: float, *, created_at: float) -> Generator[Decision, int, bool]:
        pod = self.requests[function]
        table, ids = self.nodes.table(now)
        started = time.perf_counter()
        feasible = filtering.filter_nodes(pod, table, explain=False).feasible
        if not feasible.any():
            self._request_node(function, now)
            return False
        row = yield Decision(now=now, function=function, pod=pod, nodes=table, feasible=feasible)
        self.result.decision_us.append((time.perf_counter() - started) * 1e6)
        if not (0 <= row < len(table) and feasible[row]):
            raise ValueError(f"row {row} is not a feasible node for {pod.key}")
        node = int(ids[row])
        spec = self.functions[function]
        scheduled = now + self.startup.scheduling_s
        image_ready, pulled = self.nodes.image_ready(node, spec.image, spec.image_bytes, scheduled)
        if pulled:
            self.result.pulls += 1
            self.nodes.collect_images(node, self._images_in_use(node) | {spec.image})
        ready_at = max(scheduled, image_ready) + self.startup.container_start_s + self.startup.runtime_init_s
        self.result.meters.weighted_pull_s += PRIORITY_WEIGHT[spec.priority] * (image_ready - scheduled)
        self.nodes.add_pod(node, pod, now)
        self.pods.append(
            _Pod(
                function=function,
                node=node,
                ready_at=ready_at,
                created_at=created_at,
                placed_at=now,
                pull_s=image_ready - scheduled,
            )
        )
        pod_id = len(self.pods) - 1
        self.pod_columns.add(function, node)
        self.by_function[function].append(pod_id)
        heapq.heappush(self.starting, (ready_at, pod_id))
        self.result.pods_started += 1
        return True

    def _images_in_use(self, node: int) -> set[str]:
        return {QUEUE_PROXY_IMAGE} | {self.image_of[service] for service in self.nodes.function_pods[node]}

    def _request_node(self, function: int, now: float) -> None:
        # Pods of a function are alike: once no pool can grow for one, the rest need not ask.
        if function not in self._no_room and not self.nodes.request_room(self.requests[function], now):
            self._no_room.add(function)

    def _place_pending(self, now: float) -> Generator[Decision, int, None]:
        """Retry waiting pods in order; once one of a function fails, its others wait too."""
        self.room_changed = False
        self.nodes.forget_promises()  # every waiting pod asks again below
        self._no_room.clear()
        waiting, self.pending = self.pending, []
        stuck: set[int] = set()
        for function in waiting:
            if function in stuck:
                self._request_node(function, now)
                self.pending.append(function)
            elif (yield from self._place(function, now, created_at=self.pending_since[function][0])):
                self.pending_since[function].pop(0)
            else:
                stuck.add(function)
                self.pending.append(function)

    def _delete_pod(self, function: int, now: float) -> None:
        self.current[function] -= 1
        if function in self.pending:  # an unplaced pod goes first
            self.pending.remove(function)
            self.pending_since[function].pop()
            return
        pods = self.by_function[function]
        starting = [p for p in pods if not self.pods[p].ready]
        self._remove(starting[-1] if starting else pods[-1], now)

    def _remove(self, pod_id: int, now: float) -> None:
        """The pod goes, and its room and readiness with it."""
        pod = self.pods[pod_id]
        self.by_function[pod.function].remove(pod_id)
        pod.alive = False
        self.pod_columns.state[pod_id] = _PodColumns.GONE
        if pod.ready:
            self.ready[pod.function] -= 1
        self.nodes.remove_pod(pod.node, self.requests[pod.function], now)
        self.room_changed = True

    def _drain_one(self, now: float) -> Generator[Decision, int, None]:
        """The cluster autoscaler's scale-down of a node that is not empty: the first unneeded
        node (`Nodes.drain_candidates`) whose pods all fit on the other ready nodes goes, its
        pods evicted and created again by their ReplicaSets, placed as any new pod is. One node
        per scan, as its default `max-drain-parallelism` of 1; the ten longest unneeded are
        tried (the real one tries every unneeded node)."""
        candidates = self.nodes.drain_candidates(now)[:10].tolist()
        if not candidates:
            return
        table, ids = self.nodes.table(now)  # unchanged until a node is drained
        live = self.pod_columns.state[: self.pod_columns.size] != _PodColumns.GONE
        for node in candidates:
            pods = np.flatnonzero(live & (self.pod_columns.node[: self.pod_columns.size] == node)).tolist()
            if not self._fit_elsewhere(table.take(np.flatnonzero(ids != node)), pods):
                continue
            for pod_id in pods:  # evicted: each ReplicaSet creates its pod again, below
                self.current[self.pods[pod_id].function] -= 1
                self._remove(pod_id, now)
            self.result.evictions += len(pods)
            self.nodes.release(node)
            for pod_id in pods:
                yield from self._create_pod(self.pods[pod_id].function, now)
            return

    def _fit_elsewhere(self, others: NodeTable, pods: list[int]) -> bool:
        """Whether every one of `pods` passes the scheduler's filter on some node of `others`,
        each taking its room before the next is tried (the autoscaler's own simulation)."""
        for pod_id in pods:
            request = self.requests[self.pods[pod_id].function]
            feasible = np.flatnonzero(filtering.filter_nodes(request, others, explain=False).feasible)
            if not feasible.size:
                return False
            taken = np.zeros(len(others), dtype=np.int64)
            taken[feasible[0]] = 1
            others = replace(
                others,
                cpu_requested=others.cpu_requested + taken * request.cpu_milli,
                memory_requested=others.memory_requested + taken * request.memory_bytes,
                gpu_requested=others.gpu_requested + taken * request.gpu,
                pod_count=others.pod_count + taken,
            )
        return True

    def _start_ready_pods(self, until: float) -> None:
        while self.starting and self.starting[0][0] <= until:
            ready_at, pod_id = heapq.heappop(self.starting)
            pod = self.pods[pod_id]
            if not pod.alive:
                continue
            pod.ready = True
            self.pod_columns.state[pod_id] = _PodColumns.READY
            self.ready[pod.function] += 1
            self.startups_s[pod.function].append(ready_at - pod.created_at)
            self._release_buffered(pod.function, ready_at, pod)
            self.has_started[pod.function] = True

    def _release_buffered(self, function: int, ready_at: float, pod: _Pod | None) -> None:
        """Buffered requests go to the pod now ready (None: the run ended while they waited)."""
        first_start = not self.has_started[function]
        for arrived, count in self.buffered[function]:
            wait = max(ready_at - arrived, 0.0)
            self._record_wait(function, wait, count)
            if pod is not None:
                capacity = min(max(pod.placed_at - max(arrived, pod.created_at), 0.0), wait)
                self.result.capacity_hist[_bin(capacity)] += count
                self.result.startup_hist[_bin(wait - capacity)] += count
                if first_start:
                    self.result.first_start_hist[_bin(wait - capacity)] += count
                if pod.pull_s > 0.0:
                    weight = PRIORITY_WEIGHT[self.functions[function].priority]
                    self.result.meters.weighted_request_pull_s += weight * count * min(wait, pod.pull_s)
        self.buffered[function].clear()
        self.waiting[function] = False

    def _time_out_requests(self, now: float) -> None:
        """The activator fails requests buffered for `REQUEST_TIMEOUT_S`: each counts as having
        waited exactly that long (and so missed its SLA)."""
        for function in self.waiting.nonzero()[0].tolist():
            buffered = self.buffered[function]
            while buffered and buffered[0][0] + REQUEST_TIMEOUT_S <= now:
                _, count = buffered.pop(0)
                self._record_wait(function, REQUEST_TIMEOUT_S, count)
                self.result.timed_out[self.functions[function].priority] += count
            self.waiting[function] = bool(buffered)

    def _record_wait(self, function: int, wait: float, count: int) -> None:
        priority = self.functions[function].priority
        weight = PRIORITY_WEIGHT[priority]
        self.result.latency_hist[priority][_bin(wait)] += count
        self.result.meters.weighted_cold_s += weight * wait * count
        if wait > SLA_TARGET_S[priority]:
            self.result.meters.weighted_sla_violations += weight * count

    # -- accounting -------------------------------------------------------------------
    def _scale_up_waiters(self, now: float) -> float:
        """Priority-weighted waiting pods a node is being added for, in their first
        `SCALE_UP_WAIT_S` of waiting."""
        total = 0.0
        for function in set(self.pending) - self._no_room:
            recent = sum(1 for created in self.pending_since[function] if now - created <= SCALE_UP_WAIT_S)
            total += PRIORITY_WEIGHT[self.functions[function].priority] * recent
        return total

    def _account(self, now: float) -> None:
        nodes = self.nodes
        if self.pending:
            weights = sum(PRIORITY_WEIGHT[self.functions[f].priority] for f in self.pending)
            self.result.meters.weighted_capacity_s += weights * METRICS_EVERY_S
            self.result.meters.weighted_scale_up_wait_s += self._scale_up_waiters(now) * METRICS_EVERY_S
        nodes.scale_down(now)
        activity = self._pod_activity()
        self._meter_paid_idle(activity)
        drawn, up = nodes.pool_watts(self._cpu_in_use(activity))
        price = nodes.pool_price_per_hour()
        self.result.pool_energy_j += drawn * METRICS_EVERY_S
        self.result.pool_up_energy_j += up * METRICS_EVERY_S
        self.result.pool_cost_usd += price * METRICS_EVERY_S / 3600.0
        alive = nodes.alive
        share = nodes.cpu_requested[alive].sum() / max(int(nodes.cpu_allocatable[alive].sum()), 1)
        self.result.meters.utilization_s += float(share) * METRICS_EVERY_S

    def _pod_activity(self) -> _PodActivity:
        """Every live pod's function and node, and whether it sits idle: ready with nothing to
        serve. A function's busy pods are taken to be its oldest ready ones (which of them is busy
        is not modelled); a starting pod is busy (pulling, starting its container)."""
        columns = self.pod_columns
        pods = np.flatnonzero(columns.state[: columns.size])  # alive, in creation order
        function, node = columns.function[pods], columns.node[pods]
        ready = columns.state[pods] == _PodColumns.READY
        busy = np.ceil(np.round(self.inflight / self.targets, 9))
        # Each ready pod's place among its function's ready pods, oldest first.
        order = np.argsort(function, kind="stable")
        ranked = function[order]
        ready_before = np.cumsum(ready[order]) - ready[order]
        first_of_function = np.searchsorted(ranked, ranked)
        place = np.empty_like(order)
        place[order] = ready_before - ready_before[first_of_function]
        return _PodActivity(function=function, node=node, idle=ready & (place >= busy[function]))

    def _cpu_in_use(self, activity: _PodActivity) -> IntArray:
        """Per node, the CPU its busy and starting pods request: what it draws power for. An idle
        pod's processes sleep, so it adds nothing to the node's draw (it may still keep the node up)."""
        active = ~activity.idle
        used = np.bincount(
            activity.node[active],
            weights=self.pod_cpu_milli[activity.function[active]],
            minlength=len(self.nodes.alive),
        )
        return np.asarray(used, dtype=np.int64)

    def _meter_paid_idle(self, activity: _PodActivity) -> None:
        """Idle memory that holds a node up, over the last METRICS_EVERY_S: a node with a busy or
        starting pod stays up whatever else it holds."""
        function, node, idle = activity.function, activity.node, activity.idle
        if not idle.any():
            return
        needed = np.zeros(len(self.nodes.alive), dtype=np.bool_)
        needed[node[~idle]] = True
        idle_only = np.zeros_like(needed)
        idle_only[node[idle]] = True
        share = self.nodes.release_share(idle_only & ~needed)
        paid = idle & (share[node] > 0)
        weights = self.memory_mb[function[paid]] * share[node[paid]] * METRICS_EVERY_S
        np.add.at(self.result.paid_wasted_mb_s, function[paid], weights)

    def _record_minute(self, minute: int) -> None:
        nodes, series = self.nodes, self.result.series
        alive = nodes.alive
        series["minute"].append(float(minute))
        series["nodes"].append(float(alive.sum()))
        series["cpu_allocation"].append(
            float(nodes.cpu_requested[alive].sum() / max(nodes.cpu_allocatable[alive].sum(), 1))
        )
        series["memory_allocation"].append(
            float(nodes.memory_requested[alive].sum() / max(nodes.memory_allocatable[alive].sum(), 1))
        )
        series["watts"].append(nodes.watts(self._cpu_in_use(self._pod_activity())))

    def _finish(self, end: float) -> None:
        """Requests still waiting at the end count with the wait they have had so far."""
        for function, waiting in enumerate(self.buffered):
            if waiting:
                self._release_buffered(function, end, None)
        if self._uncounted is not None:
            self._leave_out_warmup(*self._uncounted)
        for priority, count in zip(Priority, self.warm_by_class.tolist()):
            self.result.warm_requests[priority] = count

    def _leave_out_warmup(self, before: RunResult, warm_before: IntArray) -> None:
        """What the result holds less what it held when the warm-up ended."""
        result = self.result
        result.invocations = self.counts[:, self.warmup_minutes :].sum(axis=1)
        for name in COUNTED_AFTER_WARMUP:
            setattr(result, name, getattr(result, name) - getattr(before, name))
        for meter in fields(Meters):
            value = getattr(result.meters, meter.name) - getattr(before.meters, meter.name)
            setattr(result.meters, meter.name, value)
        for priority in Priority:
            result.latency_hist[priority] = result.latency_hist[priority] - before.latency_hist[priority]
            result.timed_out[priority] -= before.timed_out[priority]
        result.series = {name: values[self.warmup_minutes :] for name, values in result.series.items()}
        self.warm_by_class = self.warm_by_class - warm_before


def _bin(seconds: float) -> int:
    return min(int(seconds / LATENCY_BIN_S), LATENCY_BINS - 1)


# kube-scheduler's default scoring, which breaks the ties of the policy it serves (`best_row`).
DEFAULT_PROFILE = heuristics.kube_default()


def best_row(policy: PlacementPolicy, decision: Decision, ties: np.random.Generator | None = None) -> int:
    """The feasible row `policy` scores highest. Rows tied for it are told apart as the deployed
    scheduler tells them apart: by kube-scheduler's default score plugins, which our scheduler
    profile keeps and which only break the extender's ties (knative/base/scheduler.yaml,
    `plugin.extender.extender_scores`); here their resource and image terms, kube-default's
    arithmetic. Rows still tied: with `ties`, one of them uniformly at random, as
    kube-scheduler's selectHost picks (taking the first would pack pods onto low-numbered nodes
    whenever scores tie, which no real scheduler does); without, the first of them."""
    feasible = np.flatnonzero(decision.feasible)
    if feasible.size == len(decision.nodes):
        scores = np.asarray(policy.score(decision.pod, decision.nodes))
    elif placement.scores_rows_alone(policy):  # the same numbers without the candidates' table
        scores = np.asarray(policy.score(decision.pod, decision.nodes))[feasible]
    else:
        scores = np.asarray(policy.score(decision.pod, decision.nodes.take(feasible)))
    best = np.flatnonzero(scores == scores.max())
    if best.size > 1 and policy != DEFAULT_PROFILE:  # the default profile's own ties stay ties
        profile = DEFAULT_PROFILE.score(decision.pod, decision.nodes.take(feasible[best]))
        best = best[profile == profile.max()]
    if ties is None or best.size == 1:
        return int(feasible[best[0]])
    return int(feasible[best[int(ties.integers(best.size))]])


def drive(steps: Steps, choose: Callable[[Decision], int], first: int | None = None) -> RunResult:
    """Run a simulation coroutine to its end, answering each decision with `choose`. `first`:
    the coroutine is paused at a decision already, and this row answers it."""
    try:
        decision = next(steps) if first is None else steps.send(first)
        while True:
            decision = steps.send(choose(decision))
    except StopIteration as finished:
        result: RunResult = finished.value
        return result
