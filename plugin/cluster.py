"""The cluster cache: list + watch of nodes and placed pods, published as immutable snapshots.

Background tasks keep an `Inventory` current and swap a fresh `Snapshot` in; the request path
reads `cache.snapshot` and never awaits. A watch that the server ends resumes from its
last resourceVersion; a 410 Gone relists at once; a failed connection is retried with capped
exponential backoff and then relists (that proves the API is back and catches up in one
step; the history may have been compacted meanwhile). Throughout, the last snapshot keeps
serving and reports how stale it is.
In offline mode (`from_objects`) the same cache serves fixed lists and watches nothing.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.aio.client import ApiClient

from plugin import kube
from plugin.errors import KubeApiError
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


@dataclass(frozen=True, slots=True)
class WatchSettings:
    list_timeout_s: float = 30.0
    watch_timeout_s: int = 300  # the server ends each watch after this; we resume at once
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    publish_interval_s: float = 0.05  # coalesces bursts of events into one snapshot


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
                tasks.create_task(self._sync(NODES, kube.node_lister(self._api), {}))
                pods = kube.placed_pod_lister(self._api)
                tasks.create_task(self._sync(PODS, pods, {"field_selector": "spec.nodeName!="}))

    async def _publish_loop(self) -> None:
        while True:
            await self._dirty.wait()
            self.publish()
            await asyncio.sleep(self._settings.publish_interval_s)

    async def _sync(self, kind: str, lister: Callable[..., Awaitable[Any]], query: dict[str, str]) -> None:
        backoff = Backoff(self._settings.backoff_initial_s, self._settings.backoff_max_s)
        version: str | None = None
        while True:
            try:
                if version is None:
                    version = await self._relist(kind, lister, query)
                async for type_, obj in kube.watch_objects(
                    lister, resource_version=version, timeout_s=self._settings.watch_timeout_s, **query
                ):
                    version = str(obj.get("metadata", {}).get("resourceVersion") or version)
                    self._apply(kind, type_, obj)
                    backoff.reset()
            except KubeApiError as error:
                if error.status == 410:
                    logger.info("%s watch expired at resourceVersion %s; relisting", kind, version)
                    version = None
                    continue
                version = None  # relisting proves the API is back and catches up in one step
                await self._wait_after_failure(kind, error, backoff)
            except Exception as error:  # a bug must not end the watch for good
                logger.exception("%s watch failed unexpectedly", kind)
                version = None
                await self._wait_after_failure(kind, error, backoff)

    async def _relist(self, kind: str, lister: Callable[..., Awaitable[Any]], query: dict[str, str]) -> str:
        items, version = await kube.list_objects(lister, timeout_s=self._settings.list_timeout_s, **query)
        if kind == NODES:
            self._inventory.clear_nodes()
            for obj in items:
                self._inventory.upsert_node(obj)
        else:
            self._inventory.clear_pods()
            for obj in items:
                self._inventory.upsert_pod(obj)
        first = kind not in self._listed
        self._listed.add(kind)
        self._set_live(kind, True)
        logger.info("listed %d %s at resourceVersion %s", len(items), kind, version)
        if first:
            self.publish()  # readiness should not wait for the publish interval
        else:
            self._dirty.set()
        return version

    def _apply(self, kind: str, type_: str, obj: Mapping[str, Any]) -> None:
        if type_ == "BOOKMARK":
            return
        deleted = type_ == "DELETED"
        if kind == NODES:
            (self._inventory.delete_node if deleted else self._inventory.upsert_node)(obj)
        else:
            (self._inventory.delete_pod if deleted else self._inventory.upsert_pod)(obj)
        self._dirty.set()

    async def _wait_after_failure(self, kind: str, error: Exception, backoff: Backoff) -> None:
        delay = backoff.next()
        logger.warning("%s watch: %s; retrying in %.1fs (serving the last snapshot)", kind, error, delay)
        self._set_live(kind, False)
        await asyncio.sleep(delay)

    def _set_live(self, kind: str, live: bool) -> None:
        was = self._stale_since[kind]
        if live and was is not None:
            self._stale_since[kind] = None
            self._dirty.set()
        elif not live and was is None:
            self._stale_since[kind] = self.clock()
            self._dirty.set()


class Backoff:
    """Capped exponential backoff with full jitter, so replicas do not retry in lockstep."""

    def __init__(self, initial_s: float, max_s: float) -> None:
        self._initial, self._max = initial_s, max_s
        self._attempt = 0

    def next(self) -> float:
        ceiling = min(self._max, self._initial * 2**self._attempt)
        self._attempt += 1
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self._attempt = 0
