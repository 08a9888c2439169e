"""The simulated nodes: capacity and usage, kubelet image caches, power, price, autoscaling.

All nodes a run may ever have (each pool up to its `max`) get a row up front; `alive` marks
those that exist. `table()` packs the ready ones into the same `NodeTable` the extender builds,
so placement runs through the very policy objects the service uses.
Image caches follow the kubelet: an image lands on disk when its pull completes (size /
bandwidth), and when disk use passes 85 % the least recently used images no running pod
needs are removed until it is under 80 % (imageGCHigh/LowThresholdPercent defaults).
The cluster autoscaler model adds a node of the cheapest pool that fits a pending pod, ready
after a provisioning delay, and releases nodes left empty for 10 minutes (the
cluster-autoscaler's scale-down-unneeded-time default), down to each pool's `min`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from policies.types import ClusterObjects, NodeTable, PodRequest, Taint
from simulator.clusterspec import ClusterSpec

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
IMAGE_GC_HIGH, IMAGE_GC_LOW = 0.85, 0.80
SCALE_DOWN_UNNEEDED_S = 600.0
PROVISIONING_S = 90.0  # a cloud VM joining the cluster: typically 1-2 minutes


@dataclass(slots=True)
class ImageCache:
    """One node's images: size, when each became (or becomes) available, and last use."""

    capacity: int
    sizes: dict[str, int] = field(default_factory=dict)
    available_at: dict[str, float] = field(default_factory=dict)
    last_used: dict[str, float] = field(default_factory=dict)
    used: int = 0

    def ready_time(self, image: str, size: int, now: float, bandwidth: float) -> tuple[float, bool]:
        """When `image` can run here, and whether that takes a pull; starts the pull if needed."""
        if image in self.available_at:
            self.last_used[image] = now
            return max(now, self.available_at[image]), False
        done = now + size / bandwidth
        self.sizes[image], self.available_at[image], self.last_used[image] = size, done, now
        self.used += size
        return done, True

    def collect(self, in_use: set[str]) -> None:
        if self.used <= IMAGE_GC_HIGH * self.capacity:
            return
        for image in sorted(self.last_used, key=self.last_used.__getitem__):
            if self.used <= IMAGE_GC_LOW * self.capacity:
                break
            if image not in in_use:
                self.used -= self.sizes.pop(image)
                del self.available_at[image], self.last_used[image]


class _ImageIndex(Mapping[str, tuple[IntArray, IntArray]]):
    """`ClusterObjects.image_index` computed on demand from the caches of the table's nodes."""

    def __init__(self, caches: list[ImageCache], now: float) -> None:
        self._caches, self._now = caches, now

    def get(self, image: str, default: object = None) -> tuple[IntArray, IntArray] | None:  # type: ignore[override]
        rows = [i for i, c in enumerate(self._caches) if c.available_at.get(image, np.inf) <= self._now]
        if not rows:
            return None
        return np.asarray(rows, np.int64), np.asarray([self._caches[i].sizes[image] for i in rows], np.int64)

    def __getitem__(self, image: str) -> tuple[IntArray, IntArray]:
        found = self.get(image)
        if found is None:
            raise KeyError(image)
        return found

    def __iter__(self) -> Iterator[str]:
        return iter({image for cache in self._caches for image in cache.sizes})

    def __len__(self) -> int:
        return len(set(self))


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
        self.caches = [ImageCache(capacity=p.image_disk_bytes) for p in pools]
        self.function_pods: list[dict[str, int]] = [{} for _ in rows]
        self.labels = np.array(
            [
                {
                    "kubernetes.io/hostname": n,
                    "topology.kubernetes.io/zone": p.zones[i % len(p.zones)],
                    "kdrl.dev/pool": p.name,
                    **dict(p.labels),
                }
                for n, p, (_, i) in zip(self.names, pools, rows)
            ],
            dtype=object,
        )
        taint_sets = [tuple(Taint(key=k, value=v, effect=e) for k, v, e in p.taints) for p in spec.pools]
        self.taint_sets: tuple[tuple[Taint, ...], ...] = ((), *dict.fromkeys(t for t in taint_sets if t))
        self.taint_set = np.array([self.taint_sets.index(taint_sets[p]) for p, _ in rows], dtype=np.int64)
        self.power = [p.power for p in spec.pools]

    def ready(self, now: float) -> IntArray:
        return np.flatnonzero(self.alive & (self.ready_at <= now))

    def table(self, now: float) -> tuple[NodeTable, IntArray]:
        """The ready nodes as a `NodeTable`, and their node ids."""
        ids = self.ready(now)
        caches = [self.caches[i] for i in ids]
        cluster = ClusterObjects(
            names=self.names[ids],
            labels=self.labels[ids],
            taints=np.fromiter(
                (self.taint_sets[t] for t in self.taint_set[ids]), dtype=object, count=ids.size
            ),
            images=np.fromiter((c.sizes for c in caches), dtype=object, count=ids.size),
            function_pods=np.fromiter((self.function_pods[i] for i in ids), dtype=object, count=ids.size),
            image_index=_ImageIndex(caches, now),
            taint_sets=self.taint_sets,
        )
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
                self.alive[node] = False
                self.caches[node] = ImageCache(capacity=self.caches[node].capacity)
                released.append(int(node))
        return released

    def watts(self, now: float) -> float:
        """Power draw of every node that exists, from its CPU allocation (utilization proxy)."""
        total = 0.0
        alive = self.alive
        utilization = np.where(self.cpu_allocatable > 0, self.cpu_requested / self.cpu_allocatable, 0.0)
        for pool_id, curve in enumerate(self.power):
            members = alive & (self.pool == pool_id)
            if members.any():
                total += float(curve.at(utilization[members]).sum())
        return total
