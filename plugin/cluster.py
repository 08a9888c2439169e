"""The cluster cache: list + watch of nodes and placed pods, published as immutable snapshots.

Background tasks keep an `Inventory` current and swap a fresh `Snapshot` in; the request path
reads `cache.snapshot` and never awaits. The list+watch loop is `informer.follow`;
throughout an outage the last snapshot keeps serving and reports how stale it is.
In offline mode (`from_objects`) the same cache serves fixed lists and watches nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.aio.client import ApiClient

from plugin import informer, kube
from plugin.informer import WatchSettings
from plugin.inventory import Inventory
from policies.types import NodeTable, PodRequest

logger = logging.getLogger(__name__)

Clock = Callable[[], float]
NODES, PODS = "nodes", "pods"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The cluster as of one moment; never mutated after it is published."""

    nodes: NodeTable
    synced: bool  # every watched kind has been listed once
    stale_since: float | None  # clock time the cache stopped being current; None while live

    def age(self, now: float) -> float:
        """Seconds the snapshot may have missed changes for (0 while the watches are live)."""
        return 0.0 if self.stale_since is None else max(0.0, now - self.stale_since)


class ClusterCache:
    """Keeps `snapshot` current from the API server (or from fixed objects, offline)."""

    def __init__(
        self, *, api: ApiClient | None, settings: WatchSettings, clock: Clock = time.monotonic
    ) -> None:
        self._api = api
        self._settings = settings
        self.clock = clock
        self._inventory = Inventory()
        self._stale_since: dict[str, float | None] = {NODES: clock(), PODS: clock()}
        self._listed: set[str] = set()
        self._dirty = asyncio.Event()
        self._snapshot = Snapshot(nodes=NodeTable.empty(), synced=False, stale_since=clock())

    @classmethod
    def from_objects(
        cls,
        nodes: Iterable[Mapping[str, Any]],
        pods: Iterable[Mapping[str, Any]],
        *,
        clock: Clock = time.monotonic,
    ) -> ClusterCache:
        """An offline cache over fixed node and pod objects (`kubectl get -o json` items)."""
        cache = cls(api=None, settings=WatchSettings(), clock=clock)
        for node in nodes:
            cache._inventory.upsert_node(node)
        for pod in pods:
            cache._inventory.upsert_pod(pod)
        cache._listed = {NODES, PODS}
        cache._stale_since = {NODES: None, PODS: None}
        cache.publish()
        return cache

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    @property
    def offline(self) -> bool:
        return self._api is None

    def publish(self) -> None:
        """Pack the inventory into a new snapshot now."""
        self._dirty.clear()
        stale = [s for s in self._stale_since.values() if s is not None]
        self._snapshot = Snapshot(
            nodes=self._inventory.table(),
            synced=self._listed >= {NODES, PODS},
            stale_since=min(stale) if stale else None,
        )

    def assume(self, uid: str, node: str, pod: PodRequest) -> None:
        """Count a pod we just bound before its watch event arrives, as kube-scheduler does."""
        self._inventory.place(uid, node, pod)
        self._dirty.set()

    async def run(self) -> None:
        """Watch until cancelled (offline: only republish after `assume`)."""
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._publish_loop())
            if self._api is not None:
                tasks.create_task(informer.follow(kube.nodes(self._api), _Kind(self, NODES), self._settings))
                tasks.create_task(
                    informer.follow(kube.placed_pods(self._api), _Kind(self, PODS), self._settings)
                )

    async def _publish_loop(self) -> None:
        while True:
            await self._dirty.wait()
            self.publish()
            await asyncio.sleep(self._settings.publish_interval_s)

    def _set_live(self, kind: str, live: bool) -> None:
        was = self._stale_since[kind]
        if live and was is not None:
            self._stale_since[kind] = None
            self._dirty.set()
        elif not live and was is None:
            self._stale_since[kind] = self.clock()
            self._dirty.set()


@dataclass(frozen=True)
class _Kind:
    """The cache's side of one informer: nodes or placed pods into the inventory."""

    cache: ClusterCache
    kind: str

    def replace(self, items: list[dict[str, Any]]) -> None:
        inventory = self.cache._inventory
        (inventory.clear_nodes if self.kind == NODES else inventory.clear_pods)()
        upsert = inventory.upsert_node if self.kind == NODES else inventory.upsert_pod
        for obj in items:
            upsert(obj)
        first = self.kind not in self.cache._listed
        self.cache._listed.add(self.kind)
        if first:
            self.cache._set_live(self.kind, True)
            self.cache.publish()  # readiness should not wait for the publish interval
        self.cache._dirty.set()

    def apply(self, type_: str, obj: dict[str, Any]) -> None:
        inventory = self.cache._inventory
        if self.kind == NODES:
            (inventory.delete_node if type_ == "DELETED" else inventory.upsert_node)(obj)
        else:
            (inventory.delete_pod if type_ == "DELETED" else inventory.upsert_pod)(obj)
        self.cache._dirty.set()

    def live(self, live: bool) -> None:
        self.cache._set_live(self.kind, live)
