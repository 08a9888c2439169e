"""Heuristic placement baselines with kube-scheduler's own scoring formulas.

Each score function is a small vectorised transcription of an upstream plugin, with the
formula in its docstring (kubernetes/kubernetes pkg/scheduler/framework/plugins/...; see
protocols.md §2). Integer arithmetic follows upstream, so `kdrl score` can be held against
the real kube-scheduler's `-v=10` logs. What is deliberately left out: TaintToleration's and
NodeAffinity's preference scoring, PodTopologySpread and InterPodAffinity, which need
cluster-wide pod state the extender does not keep.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from policies.placement import PlacementPolicy, ScoreTerm
from policies.types import FloatArray, IntArray, NodeTable, PodRequest

MAX_NODE_SCORE = 100  # framework.MaxNodeScore
# ImageLocality thresholds (imagelocality/image_locality.go): images under 23 MiB are too
# cheap to pull to matter; above 1000 MiB per container the score saturates.
IMAGE_MIN_THRESHOLD = 23 * 1024 * 1024
IMAGE_MAX_CONTAINER_THRESHOLD = 1000 * 1024 * 1024

TermFunction = Callable[[PodRequest, NodeTable], IntArray]


def least_allocated(pod: PodRequest, nodes: NodeTable) -> IntArray:
    """NodeResourcesFit, LeastAllocated: mean over cpu, memory of (alloc − req)·100 / alloc.

    `req` counts containers without requests as 100m / 200 MiB (NonZeroRequested), includes
    the incoming pod, and scores 0 once it exceeds `alloc`; resources with alloc 0 are skipped.
    """
    return _fit_score(pod, nodes, _least_requested)


def most_allocated(pod: PodRequest, nodes: NodeTable) -> IntArray:
    """NodeResourcesFit, MostAllocated (bin-packing): mean of min(req, alloc)·100 / alloc."""
    return _fit_score(pod, nodes, _most_requested)


def _fit_score(
    pod: PodRequest, nodes: NodeTable, per_resource: Callable[[IntArray, IntArray], IntArray]
) -> IntArray:
    cpu = per_resource(nodes.cpu_nonzero_requested + pod.cpu_milli_nonzero, nodes.cpu_allocatable)
    memory = per_resource(nodes.memory_nonzero_requested + pod.memory_bytes_nonzero, nodes.memory_allocatable)
    # A resource with allocatable 0 scores 0 above and is left out of the mean here.
    counted = np.add(nodes.cpu_allocatable > 0, nodes.memory_allocatable > 0, dtype=np.int64)
    return (cpu + memory) // np.maximum(counted, 1)


def _least_requested(requested: IntArray, allocatable: IntArray) -> IntArray:
    # Past `allocatable` the quotient is negative: the floor at 0 is upstream's "score 0".
    score: IntArray = np.maximum((allocatable - requested) * MAX_NODE_SCORE // np.maximum(allocatable, 1), 0)
    return score


def _most_requested(requested: IntArray, allocatable: IntArray) -> IntArray:
    safe = np.maximum(allocatable, 1)
    return np.minimum(requested, allocatable) * MAX_NODE_SCORE // safe


def balanced_allocation(pod: PodRequest, nodes: NodeTable) -> IntArray:
    """NodeResourcesBalancedAllocation as of Kubernetes 1.36 (PR #135573): 50..100, 75 = even.

    S(x) = ⌊(1 − |f_cpu − f_mem| / 2)·100⌋ with f_r = min(req_r / alloc_r, 1) on real requests;
    score = 50 + (50 + S(with pod) − S(without pod)) / 2, rewarding nodes the pod balances.
    A pod that requests neither CPU nor memory gets 0 everywhere (upstream skips the plugin).
    """
    if pod.cpu_milli == 0 and pod.memory_bytes == 0:
        return np.zeros(len(nodes), dtype=np.int64)
    cpu_allocatable = np.maximum(nodes.cpu_allocatable, 1)
    memory_allocatable = np.maximum(nodes.memory_allocatable, 1)
    alone = (nodes.cpu_allocatable <= 0) | (nodes.memory_allocatable <= 0)  # one resource: std 0

    def balance(cpu: int, memory: int) -> IntArray:
        cpu_f = np.minimum((nodes.cpu_requested + cpu) / cpu_allocatable, 1.0)
        mem_f = np.minimum((nodes.memory_requested + memory) / memory_allocatable, 1.0)
        std = np.abs(cpu_f - mem_f) / 2
        std[alone] = 0.0
        score: IntArray = ((1.0 - std) * MAX_NODE_SCORE).astype(np.int64)
        return score

    return 50 + (50 + balance(pod.cpu_milli, pod.memory_bytes) - balance(0, 0)) // 2


def image_locality(pod: PodRequest, nodes: NodeTable) -> IntArray:
    """ImageLocality: 100·(clamp(Σ size·spread, 23 MiB, 1000 MiB·n) − 23 MiB) / range.

    Σ runs over the pod's n container and init-container images present on the node;
    `spread` is the share of all cluster nodes holding that image, so images everywhere count
    little (scheduling there would not reduce pulls elsewhere).
    """
    size = len(nodes)
    if not pod.images or size == 0:
        return np.zeros(size, dtype=np.int64)
    total = np.zeros(size, dtype=np.int64)
    for image in pod.images:
        spread = nodes.image_spread(image)
        if spread > 0.0:
            total += (nodes.image_sizes(image) * spread).astype(np.int64)
    ceiling = IMAGE_MAX_CONTAINER_THRESHOLD * len(pod.images)
    clamped = np.clip(total, IMAGE_MIN_THRESHOLD, ceiling)
    return MAX_NODE_SCORE * (clamped - IMAGE_MIN_THRESHOLD) // (ceiling - IMAGE_MIN_THRESHOLD)


def cheapness(pod: PodRequest, nodes: NodeTable) -> IntArray:
    """Price per allocatable core, 100 for the cheapest candidate down to 0 for the dearest
    (all 0 when prices are unknown or equal). Not upstream: from `kdrl.dev/hourly-price`."""
    economics = nodes.cluster.economics
    per_core = economics.price_per_hour[nodes.origin] / np.maximum(nodes.cpu_allocatable, 1)
    return _lower_is_better(per_core)


def power_efficiency(pod: PodRequest, nodes: NodeTable) -> IntArray:
    """Marginal watts per core (max − idle over cores), 100 for the most efficient candidate."""
    economics = nodes.cluster.economics
    watts = economics.max_watts[nodes.origin] - economics.idle_watts[nodes.origin]
    return _lower_is_better(watts / np.maximum(nodes.cpu_allocatable, 1))


def _lower_is_better(values: FloatArray) -> IntArray:
    if values.size == 0:
        return np.zeros(0, dtype=np.int64)
    low, high = float(values.min()), float(values.max())
    if high <= low:
        return np.zeros(values.size, dtype=np.int64)
    return np.floor(MAX_NODE_SCORE * (high - values) / (high - low)).astype(np.int64)


# Terms whose score for a node reads that node and cluster-wide image spread only.
ROW_TERMS = frozenset({least_allocated, most_allocated, balanced_allocation, image_locality})

TERMS: dict[str, TermFunction] = {
    "LeastAllocated": least_allocated,
    "MostAllocated": most_allocated,
    "BalancedAllocation": balanced_allocation,
    "ImageLocality": image_locality,
    "Cheapness": cheapness,
    "PowerEfficiency": power_efficiency,
}


@dataclass(frozen=True)
class WeightedSumPolicy:
    """Σ weight · term over named upstream score plugins: kube-scheduler's own arithmetic."""

    name: str
    parts: tuple[tuple[str, float, TermFunction], ...]

    @property
    def scores_rows_alone(self) -> bool:  # see placement.scores_rows_alone
        return all(fn in ROW_TERMS for _, _, fn in self.parts)

    def terms(self, pod: PodRequest, nodes: NodeTable) -> tuple[ScoreTerm, ...]:
        return tuple(
            ScoreTerm(name=term, weight=weight, values=fn(pod, nodes).astype(np.float64))
            for term, weight, fn in self.parts
        )

    def score(self, pod: PodRequest, nodes: NodeTable) -> FloatArray:
        total = np.zeros(len(nodes), dtype=np.float64)
        for _, weight, fn in self.parts:  # what `terms` sums, without building them
            total += weight * fn(pod, nodes)
        return total


def kube_default() -> WeightedSumPolicy:
    """The default profile's resource and image scoring, with its weights (all 1)."""
    return _default_profile("kube-default", least_allocated)


def most_allocated_policy() -> WeightedSumPolicy:
    """The upstream bin-packing profile: NodeResourcesFit's strategy set to MostAllocated."""
    return _default_profile("most-allocated", most_allocated)


def _default_profile(name: str, fit: TermFunction) -> WeightedSumPolicy:
    return WeightedSumPolicy(
        name=name,
        parts=(
            ("NodeResourcesFit", 1.0, fit),
            ("NodeResourcesBalancedAllocation", 1.0, balanced_allocation),
            ("ImageLocality", 1.0, image_locality),
        ),
    )


@dataclass(frozen=True)
class RandomPolicy:
    """Uniform random scores, seeded by the policy seed and the pod, so a pod's draw repeats."""

    seed: int = 0
    name: str = "random"

    def score(self, pod: PodRequest, nodes: NodeTable) -> FloatArray:
        pod_key = zlib.crc32(f"{pod.key}/{pod.uid}".encode())
        return np.random.default_rng([self.seed, pod_key]).random(len(nodes))


def weighted(name: str, weights: Mapping[str, float]) -> WeightedSumPolicy:
    """A weighted mix of `TERMS` (terms with weight 0 are left out)."""
    unknown = set(weights) - set(TERMS)
    if unknown:
        raise ValueError(f"unknown score terms {sorted(unknown)}; known: {', '.join(TERMS)}")
    return WeightedSumPolicy(
        name=name, parts=tuple((term, float(w), TERMS[term]) for term, w in weights.items() if w)
    )


TUNED_WEIGHTS = Path(__file__).resolve().parent / "models" / "tuned.json"


def tuned(path: Path = TUNED_WEIGHTS) -> WeightedSumPolicy:
    """The best tuned heuristic: weights grid-searched on the training split (`kdrl tune`)."""
    try:
        document = json.loads(path.read_text())
        weights = {str(k): float(v) for k, v in document["weights"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"{path}: cannot read tuned weights ({error})") from error
    return weighted("tuned", weights)


HEURISTIC_NAMES = ("kube-default", "most-allocated", "random", "tuned")


def by_name(name: str, *, seed: int = 0) -> PlacementPolicy:
    """The heuristic called `name`; raises KeyError naming the known ones otherwise."""
    if name == "kube-default":
        return kube_default()
    if name == "most-allocated":
        return most_allocated_policy()
    if name == "random":
        return RandomPolicy(seed=seed)
    if name == "tuned":
        return tuned()
    raise KeyError(f"unknown placement policy {name!r}; known: {', '.join(HEURISTIC_NAMES)}")
