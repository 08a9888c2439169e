"""Warm replicas on a cluster: the planner's entries applied to routed Revisions (thin adapter).

What to change comes from `prewarm.actuation` (pure); this module finds the routed revisions
of a Knative Service, reads each one, and sends the merge patch guarded by its
`resourceVersion` (a conflict re-reads once). In shadow mode it computes and records the same
changes and sends nothing. Every change is a span with the reason.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any

from kubernetes.aio.client import ApiClient
from opentelemetry import trace

from plugin import kube, metrics
from plugin.errors import KubeApiError
from plugin.functions import routed_revisions
from prewarm import actuation, prepull, rfc3339

logger = logging.getLogger(__name__)
tracer = trace.get_tracer(__name__)
Decide = Callable[[Mapping[str, str]], actuation.Change]


@dataclass(frozen=True, slots=True)
class Applied:
    """One revision's outcome, for the caller's records and the shadow mode's report."""

    revision: str  # namespace/name
    reason: str
    patched: bool  # sent to the API server (False in shadow mode or when nothing changes)


class RevisionActuator:
    def __init__(self, api: ApiClient, *, timeout_s: float, shadow: bool) -> None:
        self.api, self.timeout_s, self.shadow = api, timeout_s, shadow

    async def warm(self, function: str, replicas: int, until: datetime, now: datetime) -> list[Applied]:
        """Hold `replicas` warm on each routed revision of `function` ("namespace/service");
        a window held already is renewed only when it would lapse soon after `now`."""
        return await self._each_routed(
            function, partial(actuation.warm, replicas=replicas, until=until, now=now), "warm"
        )

    async def held(self) -> list[str]:
        """Every revision ("namespace/name") carrying the plugin's records, whoever wrote them:
        a leader owns them all, including what a crashed predecessor left warm."""
        items, _ = await kube.list_objects(kube.revisions(self.api), timeout_s=self.timeout_s)
        found = []
        for revision in items:
            meta = revision.get("metadata") or {}
            if actuation.APPLIED in (meta.get("annotations") or {}):
                found.append(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
        return sorted(found)

    async def restore(self, function: str) -> list[Applied]:
        return await self._each_routed(function, actuation.restore, "restore")

    async def restore_revision(self, namespace: str, name: str) -> Applied:
        """Restore one revision (cleanup works from the revisions themselves)."""
        return await self._change(namespace, name, actuation.restore, "restore")

    async def _each_routed(self, function: str, decide: Decide, action: str) -> list[Applied]:
        namespace, _, service_name = function.partition("/")
        try:
            service = await kube.get_service(
                self.api, namespace=namespace, name=service_name, timeout_s=self.timeout_s
            )
        except KubeApiError as error:
            if error.status == 404:
                return []  # the service is gone: nothing to hold warm
            raise
        return [await self._change(namespace, name, decide, action) for name in routed_revisions(service)]

    async def _change(self, namespace: str, name: str, decide: Decide, action: str) -> Applied:
        key = f"{namespace}/{name}"
        with tracer.start_as_current_span(f"kdrl.prewarm.{action}") as span:
            span.set_attributes(
                {"k8s.namespace.name": namespace, "kdrl.revision": key, "kdrl.shadow": self.shadow}
            )
            for attempt in range(2):  # a conflict means someone wrote in between: decide again
                try:
                    revision = await kube.get_revision(
                        self.api, namespace=namespace, name=name, timeout_s=self.timeout_s
                    )
                except KubeApiError as error:
                    if error.status == 404:  # deleted mid-window: nothing left to change
                        span.set_attribute("kdrl.reason", "revision not found")
                        return Applied(key, "revision not found", patched=False)
                    raise
                annotations = (revision.get("metadata") or {}).get("annotations") or {}
                change = decide(annotations)
                span.set_attribute("kdrl.reason", change.reason)
                if change.patch is None or self.shadow:
                    return Applied(key, change.reason, patched=False)
                try:
                    await kube.patch_revision(
                        self.api,
                        namespace=namespace,
                        name=name,
                        patch=change.patch,
                        resource_version=str(revision["metadata"].get("resourceVersion", "")),
                        timeout_s=self.timeout_s,
                    )
                except KubeApiError as error:
                    if error.status == 409 and attempt == 0:
                        continue
                    raise
                logger.info("%s %s: %s", action, key, change.reason)
                if not change.renewal:  # one Event per change, none per renewed window
                    await self._record(revision, action, change.reason)
                return Applied(key, change.reason, patched=True)
        raise AssertionError("unreachable")  # the loop returns or raises

    async def _record(self, revision: kube.Obj, action: str, reason: str) -> None:
        """A Kubernetes Event on the revision, so `kubectl describe revision` says why its
        min-scale changed; best effort (the change itself is already made and traced)."""
        body = prewarm_event(revision, action, reason, datetime.now(UTC))
        try:
            await kube.create_event(
                self.api, namespace=body["metadata"]["namespace"], body=body, timeout_s=self.timeout_s
            )
        except KubeApiError as error:
            logger.warning("could not record an event on %s (%s)", body["involvedObject"]["name"], error)


def prewarm_event(revision: kube.Obj, action: str, reason: str, now: datetime) -> dict[str, Any]:
    """A core/v1 Event about a prewarm change to `revision`."""
    meta = revision.get("metadata") or {}
    stamp = rfc3339.render(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{meta.get('name')}.{uuid.uuid4().hex[:16]}",
            "namespace": meta.get("namespace"),
        },
        "involvedObject": {
            "apiVersion": "serving.knative.dev/v1",
            "kind": "Revision",
            "namespace": meta.get("namespace"),
            "name": meta.get("name"),
            "uid": meta.get("uid"),
        },
        "reason": {"warm": "Prewarmed", "restore": "PrewarmRestored"}.get(action, action),
        "message": reason,
        "type": "Normal",
        "source": {"component": "kdrl"},
        "reportingComponent": "kdrl.dev/prewarm",
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class Prepuller:
    """Runs pre-pull pods in the plugin's namespace and sweeps up the finished ones."""

    def __init__(self, api: ApiClient, *, namespace: str, timeout_s: float, shadow: bool) -> None:
        self.api, self.namespace, self.timeout_s, self.shadow = api, namespace, timeout_s, shadow

    async def ensure(self, targets: Sequence[prepull.Target]) -> list[Applied]:
        results = []
        for target in targets:
            key = f"{self.namespace}/{prepull.pod_name(target)}"
            with tracer.start_as_current_span("kdrl.prewarm.prepull") as span:
                span.set_attributes(
                    {
                        "k8s.node.name": target.node,
                        "container.image.name": target.image,
                        "kdrl.shadow": self.shadow,
                    }
                )
                if self.shadow:
                    results.append(Applied(key, f"would pull {target.image} on {target.node}", patched=False))
                    continue
                try:
                    await kube.create_pod(
                        self.api,
                        namespace=self.namespace,
                        body=prepull.pod(target, namespace=self.namespace),
                        timeout_s=self.timeout_s,
                    )
                except KubeApiError as error:
                    if error.status != 409:
                        raise
                    results.append(Applied(key, "already pulling", patched=False))
                    continue
                metrics.prewarm_pulls.add(1, {"kdrl.result": "started"})
                results.append(Applied(key, f"pulling {target.image} on {target.node}", patched=True))
        return results

    async def sweep(self) -> list[str]:
        """Delete pre-pull pods that are done (or stuck); returns their names."""
        pods, _ = await kube.list_objects(
            kube.labelled_pods(self.api, self.namespace, f"{prepull.PREPULL_LABEL}=true"),
            timeout_s=self.timeout_s,
        )
        removed = []
        for obj in pods:
            ended = prepull.outcome(obj, datetime.now(UTC))
            if ended is None:
                continue
            metrics.prewarm_pulls.add(1, {"kdrl.result": ended})
            name = obj["metadata"]["name"]
            await kube.delete_pod(self.api, namespace=self.namespace, name=name, timeout_s=self.timeout_s)
            removed.append(name)
        return removed
