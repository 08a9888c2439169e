"""An in-repo fake Kubernetes API server for tests: real HTTP, the real API's paths and formats.

It serves what the plugin calls, the way kube-apiserver answers it:
- `GET /api/v1/nodes` and `GET /api/v1/pods` list (a `NodeList`/`PodList` with
  `metadata.resourceVersion`), honouring the `spec.nodeName` field selector for pods;
- the same paths with `watch=true`: newline-delimited `{"type": ..., "object": ...}` events
  after the requested resourceVersion, `BOOKMARK`s when asked, the stream closed after
  `timeoutSeconds`, and an `ERROR` event carrying a 410 `Status` ("Expired") when the
  requested version is older than the retained history;
- `POST /api/v1/namespaces/{ns}/pods/{name}/binding`: 201 with a `Status` body, 404 for a
  missing pod, 409 when the pod already has a node or the uid precondition fails.

Tests drive it through `add`/`modify`/`delete`, `compact()` (forget history, forcing 410 on
resume), `hold` (open watches deliver nothing) and `outage` (open watches end and every
request is answered 503, as an API server behind a failing load balancer would be).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

Obj = dict[str, Any]
LIST_KINDS = {
    "nodes": "NodeList",
    "pods": "PodList",
    "triggers": "TriggerList",
    "services": "ServiceList",
    "revisions": "RevisionList",
    "leases": "LeaseList",
    "deployments": "DeploymentList",
    "images": "ImageList",
    "events": "EventList",
    "configmaps": "ConfigMapList",
}


@dataclass
class _Event:
    version: int
    kind: str  # "nodes" | "pods"
    type: str  # ADDED | MODIFIED | DELETED
    obj: Obj


@dataclass
class FakeKube:
    """The state of a tiny cluster, with an event history for watches."""

    objects: dict[str, dict[str, Obj]] = field(default_factory=lambda: {kind: {} for kind in LIST_KINDS})
    history: list[_Event] = field(default_factory=list)
    version: int = 1
    oldest_retained: int = 1
    outage: bool = False
    hold: bool = False  # open watches deliver nothing until released (to provoke a stale resume)
    requests: list[str] = field(default_factory=list)  # "GET /api/v1/nodes?watch=1", ...
    bindings: list[Obj] = field(default_factory=list)
    patches: list[tuple[str, Obj]] = field(default_factory=list)  # (namespace/name, merge patch)
    interfere: dict[str, Obj] = field(default_factory=dict)  # namespace/name -> written just before its patch
    not_served: set[str] = field(default_factory=set)  # kinds not installed: 404, as for a missing CRD
    _changed: asyncio.Event = field(default_factory=asyncio.Event)  # replaced on every change

    # -- state changes, as a controller or kubelet would make them ---------------------------
    async def add(self, kind: str, obj: Obj) -> Obj:
        return await self._record(kind, "ADDED", obj)

    async def modify(self, kind: str, obj: Obj) -> Obj:
        return await self._record(kind, "MODIFIED", obj)

    async def delete(self, kind: str, name_key: str) -> None:
        obj = self.objects[kind].pop(name_key)
        await self._record(kind, "DELETED", obj, store=False)

    def compact(self) -> None:
        """Compact history up to now, as etcd does: a watch resuming from before gets 410.

        Streams already open keep reading, as they do against a real API server."""
        self.oldest_retained = self.version

    async def _record(self, kind: str, type_: str, obj: Obj, *, store: bool = True) -> Obj:
        obj = copy.deepcopy(obj)
        self.version += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.version)
        if store:
            self.objects[kind][_key(obj)] = obj
        self.history.append(_Event(self.version, kind, type_, obj))
        self._changed.set()
        self._changed = asyncio.Event()
        return obj

    # -- HTTP ---------------------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._record_and_fail])
        app.router.add_get("/api/v1/nodes", self._collection("nodes"))
        app.router.add_get("/api/v1/pods", self._collection("pods"))
        app.router.add_get("/apis/eventing.knative.dev/v1/triggers", self._collection("triggers"))
        app.router.add_post("/api/v1/namespaces/{namespace}/pods/{name}/binding", self._bind)
        app.router.add_get("/api/v1/namespaces/{namespace}/pods", self._collection("pods"))
        app.router.add_post("/api/v1/namespaces/{namespace}/pods", self._create("pods"))
        app.router.add_post("/api/v1/namespaces/{namespace}/events", self._create("events"))
        app.router.add_delete("/api/v1/namespaces/{namespace}/pods/{name}", self._delete("pods"))
        app.router.add_get("/api/v1/namespaces/{namespace}/pods/{name}", self._get("pods"))
        serving = "/apis/serving.knative.dev/v1/namespaces/{namespace}"
        app.router.add_get(serving + "/services/{name}", self._get("services"))
        app.router.add_get(serving + "/revisions/{name}", self._get("revisions"))
        app.router.add_patch(serving + "/revisions/{name}", self._merge_patch("revisions"))
        app.router.add_get("/apis/serving.knative.dev/v1/revisions", self._collection("revisions"))
        app.router.add_get("/apis/serving.knative.dev/v1/services", self._collection("services"))
        app.router.add_get("/apis/caching.internal.knative.dev/v1alpha1/images", self._collection("images"))
        app.router.add_get(
            "/apis/apps/v1/namespaces/{namespace}/deployments/{name}", self._get("deployments")
        )
        configmaps = "/api/v1/namespaces/{namespace}/configmaps/{name}"
        app.router.add_get(configmaps, self._get("configmaps"))
        app.router.add_put(configmaps, self._replace("configmaps"))
        leases = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        app.router.add_get(leases + "/{name}", self._get("leases"))
        app.router.add_post(leases, self._create("leases"))
        app.router.add_put(leases + "/{name}", self._replace("leases"))
        return app

    def _lookup(self, kind: str, request: web.Request) -> tuple[str, Obj | None, web.Response]:
        """The object a path names: (namespace/name, the object or None, the 404 to send then)."""
        key = f"{request.match_info['namespace']}/{request.match_info['name']}"
        missing = _status(404, "NotFound", f'{kind} "{request.match_info["name"]}" not found')
        return key, self.objects[kind].get(key), missing

    def _delete(self, kind: str) -> Any:
        async def handle(request: web.Request) -> web.Response:
            key, obj, missing = self._lookup(kind, request)
            if obj is None:
                return missing
            await self.delete(kind, key)
            return web.json_response(obj)

        return handle

    def _create(self, kind: str) -> Any:
        async def handle(request: web.Request) -> web.Response:
            obj = await request.json()
            obj["metadata"]["namespace"] = request.match_info["namespace"]
            if _key(obj) in self.objects[kind]:
                return _status(409, "AlreadyExists", f'{kind} "{obj["metadata"]["name"]}" already exists')
            return web.json_response(await self.add(kind, obj), status=201)

        return handle

    def _replace(self, kind: str) -> Any:
        """PUT: the body's `metadata.resourceVersion` must be the stored one (else 409)."""

        async def handle(request: web.Request) -> web.Response:
            _, stored, missing = self._lookup(kind, request)
            if stored is None:
                return missing
            obj = await request.json()
            if obj.get("metadata", {}).get("resourceVersion") != stored["metadata"]["resourceVersion"]:
                message = "the object has been modified; please apply your changes to the latest version"
                return _status(409, "Conflict", message)
            obj["metadata"]["namespace"] = request.match_info["namespace"]
            return web.json_response(await self.modify(kind, obj))

        return handle

    def _get(self, kind: str) -> Any:
        async def handle(request: web.Request) -> web.Response:
            _, obj, missing = self._lookup(kind, request)
            return missing if obj is None else web.json_response(obj)

        return handle

    def _merge_patch(self, kind: str) -> Any:
        """RFC 7386 merge patch; a `metadata.resourceVersion` in the patch is a precondition."""

        async def handle(request: web.Request) -> web.Response:
            if request.content_type != "application/merge-patch+json":
                return _status(415, "UnsupportedMediaType", f"unsupported patch type {request.content_type}")
            key, obj, missing = self._lookup(kind, request)
            if obj is None:
                return missing
            if key in self.interfere:  # another writer wins the race to this object
                obj = await self.modify(kind, self.interfere.pop(key))
            patch = await request.json()
            wanted = patch.get("metadata", {}).pop("resourceVersion", None)
            if wanted is not None and wanted != obj["metadata"].get("resourceVersion"):
                message = "the object has been modified; please apply your changes to the latest version"
                return _status(409, "Conflict", message)
            self.patches.append((key, copy.deepcopy(patch)))
            return web.json_response(await self.modify(kind, _merged(copy.deepcopy(obj), patch)))

        return handle

    @web.middleware
    async def _record_and_fail(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append(f"{request.method} {request.path_qs}")
        if self.outage:
            return _status(503, "ServiceUnavailable", "the fake API server is in an outage")
        response: web.StreamResponse = await handler(request)
        return response

    def _collection(self, kind: str) -> Any:
        async def handle(request: web.Request) -> web.StreamResponse:
            if kind in self.not_served:
                return _status(404, "NotFound", "the server could not find the requested resource")
            if request.query.get("watch") in ("true", "1"):
                return await self._watch(request, kind)
            items = [o for o in self.objects[kind].values() if _selected(o, request)]
            return web.json_response(
                {
                    "kind": LIST_KINDS[kind],
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(self.version)},
                    "items": sorted(items, key=_key),
                }
            )

        return handle

    async def _watch(self, request: web.Request, kind: str) -> web.StreamResponse:
        since = int(request.query.get("resourceVersion") or self.version)
        timeout = float(request.query.get("timeoutSeconds") or 1800)
        bookmarks = request.query.get("allowWatchBookmarks") in ("true", "1")
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        if since < self.oldest_retained:
            expired = _status_obj(
                410, "Expired", f"too old resource version: {since} ({self.oldest_retained})"
            )
            await response.write(_line({"type": "ERROR", "object": expired}))
            return response
        last = since  # a bookmark may not claim events this stream has not delivered
        try:
            async for event in self._events_after(since, kind, request, timeout):
                await response.write(_line({"type": event.type, "object": event.obj}))
                last = event.version
            if bookmarks:
                mark = {
                    "kind": LIST_KINDS[kind].removesuffix("List"),
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(last)},
                }
                await response.write(_line({"type": "BOOKMARK", "object": mark}))
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        return response

    async def _events_after(
        self, since: int, kind: str, request: web.Request, timeout: float
    ) -> AsyncIterator[_Event]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self.outage:
            pending = [] if self.hold else [e for e in self.history if e.version > since and e.kind == kind]
            for event in pending:
                since = event.version
                if _selected(event.obj, request) or event.type == "DELETED":
                    yield event
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(remaining, 0.2))

    async def _bind(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        body = await request.json()
        pod = self.objects["pods"].get(f"{namespace}/{name}")
        if pod is None:
            return _status(404, "NotFound", f'pods "{name}" not found')
        if body.get("metadata", {}).get("name") != name:
            return _status(400, "BadRequest", "name in URL does not match the binding")
        uid = body.get("metadata", {}).get("uid")
        if uid and uid != pod["metadata"].get("uid"):
            return _status(409, "Conflict", f"Precondition failed: UID in precondition: {uid}")
        if pod.get("spec", {}).get("nodeName"):
            node = pod["spec"]["nodeName"]
            return _status(409, "Conflict", f'pod {name} is already assigned to node "{node}"')
        self.bindings.append(body)
        bound = copy.deepcopy(pod)
        bound["spec"]["nodeName"] = body["target"]["name"]
        await self.modify("pods", bound)
        return _status(201, "", "", success=True)


def _merged(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = target if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = _merged(result.get(key), value)
    return result


def _key(obj: Obj) -> str:
    meta = obj.get("metadata", {})
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else str(meta["name"])


def _selected(obj: Obj, request: web.Request) -> bool:
    """The selectors the plugin uses: namespace (from the path), `key=value` labels, and the
    field selectors `spec.nodeName!=` and `spec.nodeName=`."""
    namespace = request.match_info.get("namespace")
    if namespace and obj.get("metadata", {}).get("namespace") != namespace:
        return False
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in filter(None, request.query.get("labelSelector", "").split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    selector = request.query.get("fieldSelector", "")
    node = obj.get("spec", {}).get("nodeName") or ""
    for term in filter(None, selector.split(",")):
        if term == "spec.nodeName!=" and not node:
            return False
        if term == "spec.nodeName=" and node:
            return False
    return True


def _line(event: Obj) -> bytes:
    return json.dumps(event).encode() + b"\n"


def _status_obj(code: int, reason: str, message: str, *, success: bool = False) -> Obj:
    obj: Obj = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if success else "Failure",
        "code": code,
    }
    if not success:
        obj.update(message=message, reason=reason)
    return obj


def _status(code: int, reason: str, message: str, *, success: bool = False) -> web.Response:
    return web.json_response(_status_obj(code, reason, message, success=success), status=code)
