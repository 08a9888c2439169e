"""List, then watch, a Kubernetes collection for as long as the service runs.

The loop client-go's reflectors run: list once, watch from the list's resourceVersion, resume
from the last seen version when the server ends a watch, relist at once on 410 Gone, and on
any other failure wait (capped exponential backoff with jitter) and relist, which both proves
the API server is back and catches up in one step (the history may have been compacted).
A collection whose API is not served at all (404: an optional CRD such as Eventing's Trigger
not installed) is said once at INFO and looked for again every `absent_recheck_s`.
What to do with the objects is the `Handler`'s business.
"""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass
from typing import Any, Protocol

from plugin import kube, metrics
from plugin.errors import KubeApiError

logger = logging.getLogger(__name__)
Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class WatchSettings:
    list_timeout_s: float = 30.0
    watch_timeout_s: int = 300  # the server ends each watch after this; we resume at once
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    publish_interval_s: float = 0.05  # coalesces bursts of events into one snapshot
    absent_recheck_s: float = 300.0  # how often to look again for an API that is not installed


class Handler(Protocol):
    def replace(self, items: list[Obj]) -> None:
        """Everything the collection holds now (after a list)."""

    def apply(self, type_: str, obj: Obj) -> None:
        """One ADDED, MODIFIED or DELETED event."""

    def live(self, live: bool) -> None:
        """Whether the handler's view is following the API server right now."""


async def follow(collection: kube.Collection, handler: Handler, settings: WatchSettings) -> None:
    """Keep `handler` current with `collection` until cancelled."""
    backoff = Backoff(settings.backoff_initial_s, settings.backoff_max_s)
    for reason in ("expired", "error"):  # a series from the start, so rate() sees 0, not nothing
        metrics.watch_restarts.add(0, {"kdrl.collection": collection.name, "kdrl.reason": reason})
    version: str | None = None
    absent = False  # the API answered 404 last time: said once, looked for rarely
    while True:
        try:
            if version is None:
                items, version = await kube.list_objects(collection, timeout_s=settings.list_timeout_s)
                if absent:
                    logger.info("%s: the API is served now", collection.name)
                    absent = False
                logger.info("listed %d %s at resourceVersion %s", len(items), collection.name, version)
                handler.replace(items)
                handler.live(True)
            async for type_, obj in kube.watch_objects(
                collection, resource_version=version, timeout_s=settings.watch_timeout_s
            ):
                version = str(obj.get("metadata", {}).get("resourceVersion") or version)
                if type_ != "BOOKMARK":
                    handler.apply(type_, obj)
                backoff.reset()
        except KubeApiError as error:
            if error.status == 404 and collection.absent and version is None:
                if not absent:
                    recheck = settings.absent_recheck_s
                    logger.info("%s (%s); looking again every %.0f s", collection.absent, error, recheck)
                    absent = True
                handler.live(False)
                await asyncio.sleep(settings.absent_recheck_s)
                continue
            if error.status == 410:
                metrics.watch_restarts.add(1, {"kdrl.collection": collection.name, "kdrl.reason": "expired"})
                logger.info("%s watch expired at resourceVersion %s; relisting", collection.name, version)
                version = None
                continue
            version = None
            await _wait(collection, handler, error, backoff)
        except Exception as error:  # a bug must not end the watch for good
            logger.exception("%s watch failed unexpectedly", collection.name)
            version = None
            await _wait(collection, handler, error, backoff)


async def _wait(collection: kube.Collection, handler: Handler, error: Exception, backoff: Backoff) -> None:
    metrics.watch_restarts.add(1, {"kdrl.collection": collection.name, "kdrl.reason": "error"})
    delay = backoff.next()
    logger.warning("%s watch: %s; retrying in %.1fs (serving what it knows)", collection.name, error, delay)
    handler.live(False)
    await asyncio.sleep(delay)


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
