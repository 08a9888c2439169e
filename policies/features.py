"""The learned policy's view of one placement: features of the candidate nodes, the pod, the cluster.

One function, `encode`, serves training (the simulator's environment), evaluation and the live
extender, so the model always sees the same numbers. Features are scale-free where they can be
(fractions, ratios to the candidates' mean, logarithms), so one model fits clusters of any size
and shape. The schema (names, order, version) is hashed; a model file carries the hash and is
refused when it differs.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from policies.types import BoolArray, IntArray, NodeTable, PodRequest, Priority

Float32Array = npt.NDArray[np.float32]
GiB = float(1 << 30)

SCHEMA_VERSION = 1
NODE_FEATURES = (
    "cpu_free_after",  # share of CPU left once the pod is placed
    "memory_free_after",
    "cpu_used",  # share requested before: the position on the power curve
    "memory_used",
    "gpu_free_after",
    "node_cores_log2",
    "image_present",  # share of the pod's image bytes already on the node
    "pull_s_log",  # log1p of seconds to pull what is missing
    "function_pods_log",  # log1p of this function's pods on the node
    "zone_function_share",  # share of this function's pods in the node's zone
    "price_rel",  # hourly price / the candidates' mean
    "price_per_core_rel",
    "watts_per_core_rel",  # marginal watts of one core / the candidates' mean
    "idle_watts_rel",
    "empty",  # no pods: placing here keeps the node from being released
    "spot",
    "pods_log",
)
POD_FEATURES = (
    "cpu_cores_log",
    "memory_gib_log",
    "gpu",
    *(f"priority_{p.value}" for p in Priority),
    "lifetime_log",  # log1p of the expected pod lifetime, seconds (0: unknown)
    "image_gib",
)
CLUSTER_FEATURES = ("cpu_used", "memory_used", "nodes_log10", "empty_share", "spot_share")
SCHEMA_HASH = hashlib.sha256(
    repr((SCHEMA_VERSION, NODE_FEATURES, POD_FEATURES, CLUSTER_FEATURES)).encode()
).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class Observation:
    """`nodes`: one row of NODE_FEATURES per table row; `pod` and `cluster`: one vector each."""

    nodes: Float32Array
    pod: Float32Array
    cluster: Float32Array


def encode(
    pod: PodRequest, nodes: NodeTable, candidates: BoolArray | None = None, rows: IntArray | None = None
) -> Observation:
    """Features of `pod` on every row of `nodes` (only `rows`, in that order, when given);
    cluster and relative features are taken over the `candidates` (the feasible rows; all rows
    when None), the nodes the extender is asked about, so training and serving see the same
    context whichever rows a model scores."""
    pick = None if candidates is None or candidates.all() else candidates
    economics = nodes.cluster.economics
    price = economics.price_per_hour[nodes.origin]
    idle_watts = economics.idle_watts[nodes.origin]
    cpu_alloc = np.maximum(nodes.cpu_allocatable, 1).astype(np.float64)
    mem_alloc = np.maximum(nodes.memory_allocatable, 1).astype(np.float64)
    cores = cpu_alloc / 1000.0
    price_per_core = price / cores
    marginal_watts = (economics.max_watts[nodes.origin] - idle_watts) / cores
    empty = nodes.pod_count == 0
    spot = economics.spot[nodes.origin]

    image_bytes = 0.0
    present = np.zeros(len(nodes))
    for image in pod.images:
        sizes = nodes.image_sizes(image)
        image_bytes += float(sizes.max()) if len(nodes) else 0.0
        present += sizes
    function_pods = _function_pods(pod, nodes)
    zone_share = _zone_share(function_pods, economics.zone[nodes.origin], len(economics.zones))
    means = [_mean(values, pick) for values in (price, price_per_core, marginal_watts, idle_watts)]
    cluster = _cluster_features(nodes, cpu_alloc, mem_alloc, empty, spot, pick)

    table = nodes
    if rows is not None:  # every per-row array below, on the scored rows only
        table = nodes.take(rows)
        price, price_per_core, idle_watts, cpu_alloc, mem_alloc, cores = (
            a[rows] for a in (price, price_per_core, idle_watts, cpu_alloc, mem_alloc, cores)
        )
        marginal_watts, empty, spot = marginal_watts[rows], empty[rows], spot[rows]
        present, function_pods, zone_share = present[rows], function_pods[rows], zone_share[rows]

    # Filled column by column in float64 and stored as float32: the numbers training saw.
    out = np.empty((len(table), len(NODE_FEATURES)), dtype=np.float32)
    out[:, 0] = (cpu_alloc - table.cpu_requested - pod.cpu_milli) / cpu_alloc
    out[:, 1] = (mem_alloc - table.memory_requested - pod.memory_bytes) / mem_alloc
    out[:, 2] = table.cpu_requested / cpu_alloc
    out[:, 3] = table.memory_requested / mem_alloc
    out[:, 4] = np.minimum(table.gpu_allocatable - table.gpu_requested - pod.gpu, 8) / 8.0
    out[:, 5] = np.log2(cores)
    if image_bytes:
        out[:, 6] = present / image_bytes
        pull_bytes_per_s = economics.pull_bytes_per_s[table.origin]
        out[:, 7] = np.log1p(np.maximum(image_bytes - present, 0.0) / pull_bytes_per_s)
    else:
        out[:, 6], out[:, 7] = 1.0, 0.0
    out[:, 8] = np.log1p(function_pods)
    out[:, 9] = zone_share
    for column, values, mean in zip(
        (10, 11, 12, 13), (price, price_per_core, marginal_watts, idle_watts), means
    ):
        out[:, column] = values / mean if mean > 0 else 1.0
    out[:, 14] = empty
    out[:, 15] = spot
    out[:, 16] = np.log1p(table.pod_count)

    priority = [float(pod.priority is p) for p in Priority]
    pod_features = np.array(
        [
            np.log1p(pod.cpu_milli / 1000.0),
            np.log1p(pod.memory_bytes / GiB),
            float(pod.gpu),
            *priority,
            np.log1p(max(pod.expected_lifetime_s, 0.0)) / 10.0,
            image_bytes / GiB,
        ],
        dtype=np.float32,
    )
    return Observation(nodes=out, pod=pod_features, cluster=cluster)


def _cluster_features(
    nodes: NodeTable,
    cpu_alloc: npt.NDArray[np.float64],
    mem_alloc: npt.NDArray[np.float64],
    empty: BoolArray,
    spot: BoolArray,
    pick: BoolArray | None,
) -> Float32Array:
    chosen = len(nodes) if pick is None else int(pick.sum())
    rows = slice(None) if pick is None else pick
    return np.array(
        [
            nodes.cpu_requested[rows].sum() / cpu_alloc[rows].sum() if chosen else 0.0,
            nodes.memory_requested[rows].sum() / mem_alloc[rows].sum() if chosen else 0.0,
            np.log10(max(chosen, 1)),
            empty[rows].sum() / max(chosen, 1),
            spot[rows].sum() / max(chosen, 1),
        ],
        dtype=np.float32,
    )


def _function_pods(pod: PodRequest, nodes: NodeTable) -> npt.NDArray[np.float64]:
    if not pod.function:
        return np.zeros(len(nodes))
    return nodes.function_pod_counts(pod.function).astype(np.float64)


def _zone_share(
    function_pods: npt.NDArray[np.float64], zone: IntArray, zones: int
) -> npt.NDArray[np.float64]:
    """Per row, the share of this function's pods that run in the node's zone (0 without pods)."""
    total = function_pods.sum()
    if not total:
        return np.zeros(len(function_pods))
    per_zone = np.asarray(np.bincount(zone, weights=function_pods, minlength=zones), dtype=np.float64)
    share: npt.NDArray[np.float64] = per_zone[zone] / total
    return share


def _mean(values: npt.NDArray[np.float64], pick: BoolArray | None) -> float:
    """The mean among the picked rows (all rows: None); relative features are values over it,
    and 1 everywhere when it is 0."""
    chosen = values if pick is None else values[pick]
    return float(chosen.mean()) if chosen.size else 0.0
