"""The prewarm planner: forecasts and cluster state in, warm replicas and image pre-pulls out.

Pure: no clock (the caller passes `now_minute`), no I/O. For each function it weighs the
expected benefit of a warm replica until the next plan, P(invoked within the lookahead) x the
cold start it avoids x its priority's value (`batch` the least: it gets what the others leave),
against its cost: idle memory-time at idle power, plus the node's price unless it fits free
memory (and, for a GPU function, a free GPU) on nodes that stay up anyway, and a whole node's
price where the function's own pods are what keep their nodes up. One memory budget
serves all functions, counted in the memory each replica is expected to leave idle (the goal's
unit: a replica of a function that is nearly always busy wastes little) and spent highest benefit
per expected idle byte first, smaller functions favoured so that the bytes keep as many functions
warm as they can (a Lagrangian knapsack solved greedily each cycle), up to a share of the memory
the hybrid histogram would leave idle now; the operator's GiB budget caps the memory held.
The replicas it holds expire after the window unless a later plan renews them; a function whose
author opted out (`kdrl.dev/prewarm: "false"`) is left alone. Every entry says why
(probability, window, benefit, cost, the function's idle-time class, whether it pays
node-hours), which is what spans and the shadow mode show. Image pre-pulls go to the top-k
nodes the active placement policy would choose for the function's next pod, where the image is
missing.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import numpy.typing as npt

from forecaster import idletimes
from forecaster.forecasting import Forecast
from policies import ranking
from policies.placement import PlacementPolicy
from policies.types import IntArray, NodeTable, PodRequest, Priority

GiB = float(1 << 30)

# How much a second of cold start costs, in dollars, by priority: the operator's exchange
# rate between latency and money (critical functions are worth keeping warm at a premium).
DEFAULT_COLD_START_VALUE_PER_S: Mapping[Priority, float] = {
    Priority.CRITICAL: 0.01,
    Priority.HIGH: 0.004,
    Priority.NORMAL: 0.001,
    Priority.LOW: 0.0003,
    Priority.BATCH: 0.00005,  # the lowest value per byte: what the others leave
}


@dataclass(frozen=True)
class PlannerSettings:
    window_minutes: int = 10  # how long one plan's warm capacity lasts unless renewed (its expiry)
    # How soon an invocation must be likely for capacity to be warmed now: plans are redone every
    # minute and a pod starts in seconds, so warming earlier only idles memory.
    lookahead_minutes: int = 3
    # Below this chance of a call within the lookahead a function is not weighed at all. Low, so
    # that the budget's order decides: a small function called a few times a day can be worth
    # its few bytes (0.01 until 2026-12-06 kept them all out; docs/prewarm.md).
    min_probability: float = 0.002
    cold_start_value_per_s: Mapping[Priority, float] = field(
        default_factory=lambda: dict(DEFAULT_COLD_START_VALUE_PER_S)
    )
    # Idle memory: a 32 GiB node at $0.38/h is ~$3.3e-6 per GiB-second; idle power ~1 W/GiB at
    # $0.15/kWh is ~4e-8 $/GiB-s. Both are settings: operators know their own prices.
    memory_price_per_gib_s: float = 3.3e-6
    idle_power_price_per_gib_s: float = 4.0e-8
    # A GPU held idle keeps a GPU node up: its price per GPU is read from the nodes' price labels
    # (the median over GPU nodes), else this, a single-GPU inference node's on-demand price.
    gpu_price_per_hour: float = 1.0
    prepull_nodes: int = 2  # top-k placement choices to pull an image onto
    # Leave no more memory idle each cycle, in expectation, than this share of what the hybrid
    # histogram would leave idle now (on top of the budget's own cap; None: no such cap): the
    # published policy's waste, spent where it avoids the most cold starts. Below 1 because
    # Knative's own idle pods (its scale-to-zero delay) come on top of what the planner holds.
    hybrid_memory_share: float | None = 0.75
    # A replica is expected to idle (1 - P(invoked within the lookahead)) of its memory, but is
    # charged at least this share: P is a forecast, and a busy pod's memory is not free.
    idle_floor: float = 0.05
    # The order the budget is spent in: benefit per expected idle byte, divided again by the idle
    # bytes to this power less one. At 1 it is the knapsack for cold-start seconds avoided; above
    # 1 smaller functions go first, so the same bytes keep more functions warm (the goal counts
    # functions: each one's cold-start %). Chosen on two selections off the bench (docs/prewarm.md).
    size_exponent: float = 3.0
    # A node whose requested CPU or memory share is above this stays up (the cluster
    # autoscaler's --scale-down-utilization-threshold, 0.5 by default): a warm replica in its
    # free memory costs idle power, not node-hours.
    scale_down_utilization: float = 0.5


DEFAULT_COLD_START_S = 5.0  # until one is observed: the pod-startup SLO without a pull


def cold_start_estimate(observed_s: Sequence[float]) -> float:
    """The cold start a warm replica avoids, as the planner prices it: the median of the
    function's recent creation-to-ready times (one pod that waited for a node or pulled its
    image moves it little), the default before any is observed."""
    return statistics.median(observed_s) if observed_s else DEFAULT_COLD_START_S


@dataclass(frozen=True)
class FunctionState:
    """What the planner must know of a function besides its forecast."""

    function: str
    priority: Priority
    memory_bytes: int
    cold_start_s: float  # `cold_start_estimate` of its observed creation-to-ready times
    pod: PodRequest  # what its next pod would request (for placement and pre-pulls)
    prewarm_allowed: bool = True  # False when annotated kdrl.dev/prewarm: "false"
    author_min_scale: int = 0  # never plan below what the author set
    max_scale: int = 0  # the revision's max-scale: never plan above it (0: no limit)


@dataclass(frozen=True)
class Budget:
    warm_memory_bytes: int
    pulls_per_minute: int


@dataclass(frozen=True)
class Reason:
    probability: float
    window_minutes: int
    benefit_usd: float
    cost_usd: float
    pattern: str = idletimes.Pattern.NEW.value  # the function's idle-time class
    paid: bool = True  # charged node-hours (False: it fits memory and GPUs that stay up anyway)
    answer: str = "model"  # whose probability: the model's, the idle-time or the phase answer


@dataclass(frozen=True)
class WarmEntry:
    function: str
    replicas: int
    expires_minute: int
    reason: Reason


@dataclass(frozen=True)
class PullEntry:
    function: str
    image: str
    node: str
    reason: Reason


@dataclass(frozen=True)
class PrewarmPlan:
    now_minute: int
    warm: tuple[WarmEntry, ...]
    pulls: tuple[PullEntry, ...]
    skipped: tuple[tuple[str, str], ...]  # (function, why) for functions not prewarmed
    # The budget as it stood: the memory the warm entries are expected to leave idle until the
    # next plan, and the target it was spent up to (None: no hybrid share; the GiB cap only).
    idle_bytes: float = 0.0
    idle_target_bytes: float | None = None

    def replicas(self, function: str) -> int:
        return next((w.replicas for w in self.warm if w.function == function), 0)


def plan(
    now_minute: int,
    forecasts: Mapping[str, Forecast],
    states: Mapping[str, FunctionState],
    nodes: NodeTable,
    budget: Budget,
    *,
    policy: PlacementPolicy,
    settings: PlannerSettings | None = None,
) -> PrewarmPlan:
    """The plan for the next window; see the module docstring for the rules."""
    config = settings or PlannerSettings()
    candidates: list[tuple[WarmEntry, FunctionState]] = []
    skipped: list[tuple[str, str]] = []
    for function, forecast in sorted(forecasts.items()):
        state = states.get(function)
        probability = _probability(forecast, config.lookahead_minutes)
        why_not = _excluded(state, probability, config)
        if why_not:
            skipped.append((function, why_not))
            continue
        assert state is not None
        candidates.append((_evaluate(now_minute, forecast, probability, state, config), state))
    # The hybrid's idle memory is a target (the last entry may cross it, or a lone function could
    # never be warmed); the operator's budget is a hard cap on the memory held.
    target = float("inf")
    if config.hybrid_memory_share is not None:
        target = config.hybrid_memory_share * hybrid_idle_memory(forecasts, states, config)
    charges = {
        s.function: _idle_bytes(e.replicas * s.memory_bytes, e.reason.probability, config)
        for e, s in candidates
    }
    # Highest benefit per idle byte first, small functions favoured (`size_exponent`): a greedy
    # Lagrangian knapsack per cycle, its value the cold-start seconds a byte avoids at 1.
    candidates.sort(
        key=lambda c: (
            -c[0].reason.benefit_usd / max(charges[c[1].function], 1.0) ** config.size_exponent,
            c[1].function,
        )
    )
    free = free_memory(nodes, config.scale_down_utilization)
    free_gpus = free_gpu(nodes, config.scale_down_utilization)
    gpu_price_per_s = _gpu_price_per_s(nodes, config) if any(s.pod.gpu for _, s in candidates) else 0.0
    kept_up = nodes_kept_up(nodes, states, config.scale_down_utilization)
    warm, spent, spent_gpus, charged = [], 0, 0, 0.0
    for entry, state in candidates:
        need, need_gpus = entry.replicas * state.memory_bytes, entry.replicas * state.pod.gpu
        paid_memory = spent + need > free
        paid_gpus = need_gpus if spent_gpus + need_gpus > free_gpus else 0
        cost = _cost(entry.reason.probability, need, paid_memory, paid_gpus, gpu_price_per_s, config)
        if state.function in kept_up:  # its pods alone keep their nodes from scaling down
            cost = max(cost, _idle_s(entry.reason.probability, config) * kept_up[state.function])
            paid_memory = True
        if entry.reason.benefit_usd <= cost:
            skipped.append((entry.function, "cost exceeds benefit"))
        elif spent + need > budget.warm_memory_bytes or charged >= target:
            skipped.append((entry.function, "warm-memory budget exhausted"))
        else:
            spent, spent_gpus = spent + need, spent_gpus + need_gpus
            charged += charges[state.function]
            priced = replace(entry.reason, cost_usd=cost, paid=paid_memory or paid_gpus > 0)
            warm.append((replace(entry, reason=priced), state))
    pulls = _pulls(candidates, nodes, budget, policy, config)
    return PrewarmPlan(
        now_minute=now_minute,
        warm=tuple(e for e, _ in warm),
        pulls=pulls,
        skipped=tuple(sorted(skipped)),
        idle_bytes=charged,
        idle_target_bytes=None if config.hybrid_memory_share is None else target,
    )


def hybrid_idle_memory(
    forecasts: Mapping[str, Forecast], states: Mapping[str, FunctionState], config: PlannerSettings
) -> float:
    """The memory the hybrid histogram is expected to leave idle now (one instance of each
    function inside its windows, unless invoked within the lookahead), charged as the planner
    charges its own replicas: the target must cover holding what the hybrid holds."""
    return sum(
        _idle_bytes(states[function].memory_bytes, _probability(forecast, config.lookahead_minutes), config)
        for function, forecast in forecasts.items()
        if function in states and forecast.hybrid_holds
    )


def _idle_bytes(held_bytes: int, probability: float, config: PlannerSettings) -> float:
    """The memory held warm that is expected to sit idle until the next plan."""
    return held_bytes * max(1.0 - probability, config.idle_floor)


def free_memory(nodes: NodeTable, scale_down_utilization: float) -> int:
    """Unrequested memory on schedulable nodes busy enough to stay up for the window."""
    stays = _staying(nodes, scale_down_utilization)
    return int(np.clip(nodes.memory_allocatable - nodes.memory_requested, 0, None)[stays].sum())


def free_gpu(nodes: NodeTable, scale_down_utilization: float) -> int:
    """Unrequested GPUs on schedulable nodes busy enough to stay up for the window."""
    stays = _staying(nodes, scale_down_utilization)
    return int(np.clip(nodes.gpu_allocatable - nodes.gpu_requested, 0, None)[stays].sum())


def nodes_kept_up(
    nodes: NodeTable, states: Mapping[str, FunctionState], scale_down_utilization: float
) -> dict[str, float]:
    """function -> the price per second of the cheapest node its pods keep up, for each function
    whose pods are all on nodes that run no other function's pods, stay up with them and would
    scale down without them (the scale-down rule as `free_memory` reads it): holding such a
    function warm holds a whole node. A node that other functions share is left out: under a
    utilization threshold, draining it moves their pods too, so it is not this function's alone
    to pay for."""
    row_of = np.full(nodes.cluster.size, -1, dtype=np.int64)
    row_of[nodes.origin] = np.arange(len(nodes))
    price_per_s = nodes.cluster.economics.price_per_hour / 3600.0
    kept_up: dict[str, float] = {}
    for function, (origins, pods) in nodes.cluster.function_index.items():
        state, rows = states.get(function), row_of[origins]
        shared = any(len(nodes.cluster.function_pods[o]) > 1 for o in origins)
        if state is None or shared or (rows < 0).any():
            continue
        without = _staying(
            nodes,
            scale_down_utilization,
            rows,
            cpu_less=pods * state.pod.cpu_milli,
            memory_less=pods * state.pod.memory_bytes,
        )
        if (_staying(nodes, scale_down_utilization, rows) & ~without).all():
            kept_up[function] = float(price_per_s[origins].min())
    return kept_up


def _staying(
    nodes: NodeTable,
    scale_down_utilization: float,
    rows: IntArray | slice = slice(None),
    *,
    cpu_less: IntArray | int = 0,
    memory_less: IntArray | int = 0,
) -> npt.NDArray[np.bool_]:
    """Which of `rows` stay up, their requests less `cpu_less` and `memory_less`."""
    share = np.maximum(
        (nodes.cpu_requested[rows] - cpu_less) / np.maximum(nodes.cpu_allocatable[rows], 1),
        (nodes.memory_requested[rows] - memory_less) / np.maximum(nodes.memory_allocatable[rows], 1),
    )
    return np.asarray((share > scale_down_utilization) & ~nodes.unschedulable[rows], dtype=np.bool_)


def _gpu_price_per_s(nodes: NodeTable, config: PlannerSettings) -> float:
    gpus = nodes.gpu_allocatable > 0
    price = nodes.cluster.economics.price_per_hour[nodes.origin]
    per_gpu = price[gpus] / nodes.gpu_allocatable[gpus]
    known = per_gpu[per_gpu > 0]
    return float(np.median(known) if known.size else config.gpu_price_per_hour) / 3600.0


def _excluded(state: FunctionState | None, probability: float, config: PlannerSettings) -> str:
    if state is None:
        return "no state (unknown to the cluster)"
    if not state.prewarm_allowed:
        return "opted out (kdrl.dev/prewarm: false)"
    if probability < config.min_probability:
        return "unlikely to be invoked soon"
    return ""


def _probability(forecast: Forecast, window: int) -> float:
    within = forecast.best_p_within
    return float(within[min(window, len(within)) - 1]) if len(within) else 0.0


def _evaluate(
    now_minute: int, forecast: Forecast, probability: float, state: FunctionState, config: PlannerSettings
) -> WarmEntry:
    """One warm entry for `state`'s function, `probability` its chance of a call within the
    lookahead; priced later (`_cost`), in the budget's order."""
    window = config.window_minutes
    # One warm replica, as the hybrid histogram holds: it spares the start from zero, and
    # Knative scales a running function on load. Replicas for the expected concurrency (Little's
    # law, until 2026-12-04) spent the budget on busy functions whose cold-start share is small
    # anyway, and left rarely invoked ones cold (docs/prewarm.md).
    replicas = max(1, state.author_min_scale)
    if state.max_scale > 0:  # Knative would not run more: holding them warm is memory for nothing
        replicas = min(replicas, state.max_scale)
    benefit = probability * state.cold_start_s * config.cold_start_value_per_s.get(state.priority, 0.0)
    reason = Reason(
        probability=probability,
        window_minutes=window,
        benefit_usd=benefit,
        cost_usd=0.0,  # priced in order (`_cost`): it depends on what fits free memory and GPUs
        pattern=forecast.pattern.value,
        answer=forecast.answer,
    )
    return WarmEntry(
        function=state.function, replicas=replicas, expires_minute=now_minute + window, reason=reason
    )


def _cost(
    probability: float,
    need_bytes: int,
    paid_memory: bool,
    paid_gpus: int,
    gpu_price_per_s: float,
    config: PlannerSettings,
) -> float:
    """The expected cost of holding `need_bytes` (and `paid_gpus` GPUs no node that stays up has
    free) until the next plan: they sit idle unless invoked (a conservative proxy: an invoked
    replica counts as busy all that time), at idle power, plus the node's price where they would
    keep a node up (`paid_memory`)."""
    idle_s = _idle_s(probability, config)
    price = config.idle_power_price_per_gib_s + (config.memory_price_per_gib_s if paid_memory else 0.0)
    return idle_s * (need_bytes / GiB * price + paid_gpus * gpu_price_per_s)


def _idle_s(probability: float, config: PlannerSettings) -> float:
    """The seconds a replica is expected to sit idle until the next plan (invoked: busy)."""
    return config.lookahead_minutes * 60 * (1.0 - min(probability, 1.0))


def _pulls(
    ranked: Sequence[tuple[WarmEntry, FunctionState]],
    nodes: NodeTable,
    budget: Budget,
    policy: PlacementPolicy,
    config: PlannerSettings,
) -> tuple[PullEntry, ...]:
    """Pre-pull the images of the functions most worth warming, warmed or not, onto the nodes
    their next pods would go to: a pulled image is partial warmth, bought with disk instead of
    memory, and a function the budget left cold is the one whose next request waits for a pull.

    Only for functions with no pod in the cluster: their next pod is a start from zero, whose
    request waits for the pull; a running function's image is already where its pods are."""
    pulls: list[PullEntry] = []
    running = nodes.cluster.function_index
    for entry, state in ranked:  # in value order
        if len(pulls) >= budget.pulls_per_minute or not len(nodes):
            break
        image = state.pod.images[0] if state.pod.images else ""
        if not image or state.function in running:
            continue
        result = ranking.rank(state.pod, nodes, policy)
        for row in result.best_first(limit=config.prepull_nodes):
            if not result.verdicts.feasible[row] or len(pulls) >= budget.pulls_per_minute:
                continue
            if image and image not in nodes.images[row]:
                pulls.append(PullEntry(entry.function, image, str(nodes.names[row]), entry.reason))
    return tuple(pulls)


def plan_json(decided: PrewarmPlan) -> dict[str, object]:
    """A plan as JSON: what `/debug/prewarm` and the shadow mode show."""

    def why(reason: Reason) -> dict[str, object]:
        return {
            "probability": round(reason.probability, 4),
            "window_minutes": reason.window_minutes,
            "benefit_usd": round(reason.benefit_usd, 8),
            "cost_usd": round(reason.cost_usd, 8),
            "pattern": reason.pattern,
            "paid": reason.paid,
            "answer": reason.answer,
        }

    return {
        "minute": decided.now_minute,
        "warm": [
            {
                "function": w.function,
                "replicas": w.replicas,
                "expires_minute": w.expires_minute,
                **why(w.reason),
            }
            for w in decided.warm
        ],
        "pulls": [
            {"function": p.function, "image": p.image, "node": p.node, **why(p.reason)} for p in decided.pulls
        ],
        "skipped": [{"function": f, "why": reason} for f, reason in decided.skipped],
        "budget": {
            "expected_idle_bytes": round(decided.idle_bytes),
            "target_idle_bytes": None if (target := decided.idle_target_bytes) is None else round(target),
        },
    }
