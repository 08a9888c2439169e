"""The simulated nodes: capacity and usage, kubelet image caches, power, price, autoscaling.

All nodes a run may ever have (each pool up to its `max`) get a row up front; `alive` marks
those that exist. `table()` packs the ready ones into the same `NodeTable` the extender builds,
so placement runs through the very policy objects the service uses.
Image caches follow the kubelet: an image lands on disk when its pull completes (size /
bandwidth), and when disk use passes 85 % the least recently used images no running pod
needs are removed until it is under 80 % (imageGCHigh/LowThresholdPercent defaults).
The cluster autoscaler model adds a node of the cheapest pool that fits a pending pod, ready
after a provisioning delay, and releases nodes left empty for 10 minutes (the
cluster-autoscaler's scale-down-unneeded-time default), down to each pool's `min`. Optionally
(`Simulation(drain_underused=True)`) it also drains nodes under half allocated, as the real
autoscaler does (`drain_candidates`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from policies import economics
from policies.types import ClusterObjects, NodeTable, PodRequest, Taint
from simulator.clusterspec import ClusterSpec

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
IMAGE_GC_HIGH, IMAGE_GC_LOW = 0.85, 0.80
SCALE_DOWN_UNNEEDED_S = 600.0
# cluster-autoscaler defaults: a node whose pods request less than this share of it is
# unneeded if they fit elsewhere; no scale-down for this long after a scale-up
SCALE_DOWN_UTILIZATION = 0.5
SCALE_DOWN_DELAY_AFTER_ADD_S = 600.0
MiB = 1 << 20
PROVISIONING_S = 90.0  # a cloud VM joining the cluster: typically 1-2 minutes


@dataclass(slots=True)
class ImageCache:
    """One node's image filesystem: what it holds, how big, and when each was last used."""

    capacity: int
    sizes: dict[str, int] = field(default_factory=dict)
    last_used: dict[str, float] = field(default_factory=dict)
    used: int = 0

    def add(self, image: str, size: int, now: float) -> None:
        self.sizes[image], self.last_used[image] = size, now
        self.used += size

    def collect(self, in_use: set[str]) -> list[str]:
        """Garbage-collect like the kubelet; returns the images removed."""
        removed: list[str] = []
        if self.used <= IMAGE_GC_HIGH * self.capacity:
            return removed
        for image in sorted(self.last_used, key=self.last_used.__getitem__):
            if self.used <= IMAGE_GC_LOW * self.capacity:
                break
            if image not in in_use:
                self.used -= self.sizes.pop(image)
                del self.last_used[image]
                removed.append(image)
        return removed


class _ImageIndex(Mapping[str, tuple[IntArray, IntArray]]):
    """`ClusterObjects.image_index` computed on demand: the table rows whose node holds an
    image (its pull complete by `now`), from the cluster-wide availability arrays."""

    def __init__(self, nodes: Nodes, ids: IntArray, now: float) -> None:
        self._nodes, self._ids, self._now = nodes, ids, now
        self._found: dict[str, tuple[IntArray, IntArray] | None] = {}  # a table asks twice per image

    def get(self, image: str, default: object = None) -> tuple[IntArray, IntArray] | None:  # type: ignore[override]
        if image in self._found:
            return self._found[image]
        found = None
        available_at = self._nodes.available_at.get(image)
        if available_at is not None:
            rows = (available_at[self._ids] <= self._now).nonzero()[0]
            if rows.size:
                found = rows, np.full(rows.size, self._nodes.image_size[image], dtype=np.int64)
        self._found[image] = found
        return found

    def __getitem__(self, image: str) -> tuple[IntArray, IntArray]:
        found = self.get(image)
        if found is None:
            raise KeyError(image)
        return found

    def __iter__(self) -> Iterator[str]:
        return iter([image for image in self._nodes.available_at if self.get(image) is not None])

    def __len__(self) -> int:
        return len(list(iter(self)))


class Nodes:
    """Every node a run may have, as arrays indexed by node id."""

    def __init__(self, spec: ClusterSpec) -> None:
        rows = [(pool_id, i) for pool_id, pool in enumerate(spec.pools) for i in range(pool.max)]
        self.spec = spec
        self.pool = np.array([p for p, _ in rows], dtype=np.int64)
        pools = [spec.pools[p] for p, _ in rows]
        self.names = np.array([f"{spec.pools[p].name}-{i:04d}" for p, i in rows], dtype=object)
        self.cpu_allocatable = np.array([p.cpu_milli for p in pools], dtype=np.int64)
        self.memory_allocatable = np.array([p.memory_bytes for p in pools], dtype=np.int64)
        self.gpu_allocatable = np.array([p.gpus for p in pools], dtype=np.int64)
        self.price = np.array([p.price_per_hour for p in pools])
        self.bandwidth = np.array([p.pull_bytes_per_s for p in pools])
        self.cpu_requested = np.zeros(len(rows), dtype=np.int64)
        self.memory_requested = np.zeros(len(rows), dtype=np.int64)
        self.gpu_requested = np.zeros(len(rows), dtype=np.int64)
        self.pod_count = np.zeros(len(rows), dtype=np.int64)
        self.alive = np.array([i < spec.pools[p].count for p, i in rows])
        self.ready_at = np.zeros(len(rows))
        self.empty_since = np.zeros(len(rows))
        self.underused_since = np.full(len(rows), np.inf)  # under SCALE_DOWN_UTILIZATION since
        self.last_scale_up = -np.inf
        # Room on provisioning nodes promised to waiting pods this round, so that many waiting
        # pods ask for as many nodes at once, as the cluster autoscaler's estimate does.
        self.promised_cpu = np.zeros(len(rows), dtype=np.int64)
        self.promised_memory = np.zeros(len(rows), dtype=np.int64)
        self.caches = [ImageCache(capacity=p.image_disk_bytes) for p in pools]
        self.image_sets = np.fromiter((c.sizes for c in self.caches), dtype=object, count=len(rows))
        self.available_at: dict[str, FloatArray] = {}  # image -> per node: pull done (inf: absent)
        self.image_size: dict[str, int] = {}
        self.function_pods = np.array([{} for _ in rows] + [None], dtype=object)[:-1]  # dicts, kept in place
        self.labels = np.array(
            [
                {
                    "kubernetes.io/hostname": n,
                    "topology.kubernetes.io/zone": p.zones[i % len(p.zones)],
                    "kdrl.dev/pool": p.name,
                    **economics.node_labels(
                        p.price_per_hour,
                        p.power.watts[0],
                        p.power.watts[-1],
                        p.pull_bytes_per_s / MiB,
                        spot=p.spot,
                    ),
                    **dict(p.labels),
                }
                for n, p, (_, i) in zip(self.names, pools, rows)
            ],
            dtype=object,
        )
        taint_sets = [tuple(Taint(key=k, value=v, effect=e) for k, v, e in p.taints) for p in spec.pools]
        self.taint_sets: tuple[tuple[Taint, ...], ...] = ((), *dict.fromkeys(t for t in taint_sets if t))
        self.taint_set = np.array([self.taint_sets.index(taint_sets[p]) for p, _ in rows], dtype=np.int64)
        self.taints = np.fromiter((self.taint_sets[t] for t in self.taint_set), dtype=object, count=len(rows))
        self.power = [p.power for p in spec.pools]
        self.economics = economics.NodeEconomics.from_labels(self.labels)
        # The object columns of the last ready set, reused until it or a node's cache changes:
        # rebuilding them per placement cost a fifth of a simulated run.
        self._cache_generation = 0
        self._objects_key: tuple[int, bytes] | None = None
        self._objects: ClusterObjects | None = None

    def ready(self, now: float) -> IntArray:
        return (self.alive & (self.ready_at <= now)).nonzero()[0]

    def table(self, now: float) -> tuple[NodeTable, IntArray]:
        """The ready nodes as a `NodeTable`, and their node ids."""
        ids = self.ready(now)
        key = (self._cache_generation, ids.tobytes())
        if self._objects is None or key != self._objects_key:
            self._objects_key = key
            self._objects = ClusterObjects(
                names=self.names[ids],
                labels=self.labels[ids],
                taints=self.taints[ids],
                images=self.image_sets[ids],
                function_pods=self.function_pods[ids],
                image_index={},  # replaced per call: it depends on `now`
                taint_sets=self.taint_sets,
                known_economics=self.economics.take(ids),
            )
        cluster = dataclasses.replace(self._objects, image_index=_ImageIndex(self, ids, now))
        table = NodeTable(
            cpu_allocatable=self.cpu_allocatable[ids],
            memory_allocatable=self.memory_allocatable[ids],
            pods_allocatable=np.full(ids.size, 110, dtype=np.int64),
            gpu_allocatable=self.gpu_allocatable[ids],
            cpu_requested=self.cpu_requested[ids],
            memory_requested=self.memory_requested[ids],
            gpu_requested=self.gpu_requested[ids],
            cpu_nonzero_requested=self.cpu_requested[ids],  # simulated pods always request both
            memory_nonzero_requested=self.memory_requested[ids],
            pod_count=self.pod_count[ids],
            unschedulable=np.zeros(ids.size, dtype=np.bool_),
            taint_set=self.taint_set[ids],
            origin=np.arange(ids.size, dtype=np.int64),
            cluster=cluster,
        )
        return table, ids

    def add_pod(self, node: int, pod: PodRequest, now: float) -> None:
        self.cpu_requested[node] += pod.cpu_milli
        self.memory_requested[node] += pod.memory_bytes
        self.gpu_requested[node] += pod.gpu
        self.pod_count[node] += 1
        if pod.function:
            self.function_pods[node][pod.function] = self.function_pods[node].get(pod.function, 0) + 1

    def remove_pod(self, node: int, pod: PodRequest, now: float) -> None:
        self.cpu_requested[node] -= pod.cpu_milli
        self.memory_requested[node] -= pod.memory_bytes
        self.gpu_requested[node] -= pod.gpu
        self.pod_count[node] -= 1
        if pod.function:
            left = self.function_pods[node][pod.function] - 1
            if left:
                self.function_pods[node][pod.function] = left
            else:
                del self.function_pods[node][pod.function]
            self.caches[node].last_used[pod.images[0]] = now
        if self.pod_count[node] == 0:
            self.empty_since[node] = now

    def image_ready(self, node: int, image: str, size: int, now: float) -> tuple[float, bool]:
        """When `image` can run on `node` and whether that takes a pull (which starts now)."""
        available_at = self.available_at.get(image)
        if available_at is None:
            available_at = self.available_at[image] = np.full(len(self.names), np.inf)
            self.image_size[image] = size
        cache = self.caches[node]
        if np.isfinite(available_at[node]):
            cache.last_used[image] = now
            return max(now, float(available_at[node])), False
        available_at[node] = now + size / float(self.bandwidth[node])
        cache.add(image, size, now)
        return float(available_at[node]), True

    def collect_images(self, node: int, in_use: set[str]) -> None:
        for image in self.caches[node].collect(in_use):
            self.available_at[image][node] = np.inf

    def fits_empty(self, pod: PodRequest) -> npt.NDArray[np.bool_]:
        """Per pool: would the pod fit an empty node of it (taints aside: GPU pods tolerate)?"""
        pools = self.spec.pools
        return np.array(
            [
                p.cpu_milli >= pod.cpu_milli
                and p.memory_bytes >= pod.memory_bytes
                and p.gpus >= pod.gpu
                and (not p.taints or pod.gpu > 0)
                for p in pools
            ]
        )

    def request_room(self, pod: PodRequest, now: float) -> bool:
        """Promise `pod` room on a provisioning node, adding a node when none has room left;
        False when no pool may grow to hold it."""
        provisioning = self.alive & (self.ready_at > now)
        room = (
            provisioning
            & self.fits_empty(pod)[self.pool]
            & (self.cpu_allocatable - self.promised_cpu >= pod.cpu_milli)
            & (self.memory_allocatable - self.promised_memory >= pod.memory_bytes)
        )
        candidates = np.flatnonzero(room)
        node = int(candidates[0]) if candidates.size else self.scale_up(pod, now)
        if node is None:
            return False
        self.promised_cpu[node] += pod.cpu_milli
        self.promised_memory[node] += pod.memory_bytes
        return True

    def forget_promises(self) -> None:
        self.promised_cpu[:] = 0
        self.promised_memory[:] = 0

    def scale_up(self, pod: PodRequest, now: float) -> int | None:
        """Add a node of the cheapest pool that fits `pod`, if any pool may grow."""
        fits = self.fits_empty(pod)
        for pool_id in np.argsort([p.price_per_hour / p.cpu_milli for p in self.spec.pools], kind="stable"):
            if not fits[pool_id]:
                continue
            free = np.flatnonzero((self.pool == pool_id) & ~self.alive)
            if free.size:
                node = int(free[0])
                self.alive[node] = True
                self.ready_at[node] = now + PROVISIONING_S
                self.last_scale_up = now
                self.empty_since[node] = now + PROVISIONING_S
                return node
        return None

    def scale_down(self, now: float) -> list[int]:
        """Release nodes empty for long enough, keeping each pool at its minimum."""
        released = []
        for pool_id, pool in enumerate(self.spec.pools):
            members = self.alive & (self.pool == pool_id)
            idle = np.flatnonzero(
                members
                & (self.pod_count == 0)
                & (now - self.empty_since >= SCALE_DOWN_UNNEEDED_S)
                & (self.ready_at <= now)
            )
            spare = int(members.sum()) - pool.min
            for node in idle[::-1][: max(spare, 0)]:
                self.release(int(node))
                released.append(int(node))
        return released

    def release(self, node: int) -> None:
        """The node leaves the cluster, and its image cache with it."""
        self.alive[node] = False
        self.underused_since[node] = np.inf
        for image in self.caches[node].sizes:
            self.available_at[image][node] = np.inf
        self.caches[node] = ImageCache(capacity=self.caches[node].capacity)
        self.image_sets[node] = self.caches[node].sizes
        self._cache_generation += 1

    def drain_candidates(self, now: float) -> IntArray:
        """The nodes the cluster autoscaler finds unneeded now, longest first: under half
        allocated (CPU and memory; GPUs on GPU nodes) for at least `SCALE_DOWN_UNNEEDED_S`,
        in a pool above its minimum; none while a scale-up is recent
        (`scale-down-delay-after-add`). The caller drains one whose pods fit elsewhere. Called
        every scan: it keeps the clocks."""
        gpu_nodes = self.gpu_allocatable > 0
        share = np.where(
            gpu_nodes,
            self.gpu_requested / np.maximum(self.gpu_allocatable, 1),
            np.maximum(
                self.cpu_requested / self.cpu_allocatable, self.memory_requested / self.memory_allocatable
            ),
        )
        under = self.alive & (self.ready_at <= now) & (self.pod_count > 0) & (share < SCALE_DOWN_UTILIZATION)
        self.underused_since = np.where(under, np.minimum(self.underused_since, now), np.inf)
        if now - self.last_scale_up < SCALE_DOWN_DELAY_AFTER_ADD_S:
            return np.zeros(0, dtype=np.int64)
        sizes = np.bincount(self.pool[self.alive], minlength=len(self.spec.pools))
        above_min = sizes > np.array([pool.min for pool in self.spec.pools])
        unneeded = now - self.underused_since >= SCALE_DOWN_UNNEEDED_S
        eligible = np.flatnonzero(under & above_min[self.pool] & unneeded)
        return eligible[np.argsort(self.underused_since[eligible], kind="stable")]

    def release_share(self, idle_only: npt.NDArray[np.bool_]) -> FloatArray:
        """Per node, the share of the `idle_only` nodes (alive, holding idle pods alone) its pool
        would release if those pods went: a pool keeps its minimum, and empty nodes go first."""
        share = np.zeros(len(self.alive))
        for pool_id, pool in enumerate(self.spec.pools):
            members = self.alive & (self.pool == pool_id)
            candidates = members & idle_only
            count = int(candidates.sum())
            if count:
                spare = int(members.sum()) - pool.min - int((members & (self.pod_count == 0)).sum())
                share[candidates] = min(max(spare, 0), count) / count
        return share

    def watts(self, cpu_in_use: IntArray) -> float:
        """Power draw of every node that exists (`pool_watts`)."""
        return float(self.pool_watts(cpu_in_use)[0].sum())

    def pool_watts(self, cpu_in_use: IntArray) -> tuple[FloatArray, FloatArray]:
        """Per pool, the power draw of its nodes that exist, and the part they would draw idle:
        what being up costs, apart from what the pods' CPU adds. `cpu_in_use`: per node, the
        millicores its pods are using (not what they request: a node's draw follows its load)."""
        drawn, up = np.zeros(len(self.power)), np.zeros(len(self.power))
        alive = self.alive
        utilization = np.where(
            self.cpu_allocatable > 0, cpu_in_use / np.maximum(self.cpu_allocatable, 1), 0.0
        )
        for pool_id, curve in enumerate(self.power):
            members = alive & (self.pool == pool_id)
            if members.any():
                drawn[pool_id] = float(curve.at(utilization[members]).sum())
                up[pool_id] = curve.watts[0] * int(members.sum())
        return drawn, up

    def pool_price_per_hour(self) -> FloatArray:
        """Per pool, what its nodes that exist cost an hour."""
        alive = self.alive
        per_pool = np.bincount(self.pool[alive], weights=self.price[alive], minlength=len(self.power))
        return np.asarray(per_pool, dtype=np.float64)
