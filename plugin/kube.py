"""The Kubernetes adapter: every call the plugin makes to the API server lives here.

Each call is declared with `@api_call(...)`, which records its group, resource and verbs in
`API_CALLS`; the RBAC test holds the ClusterRole against that registry, so a new call
without a grant (or a grant without a call) fails CI. Objects cross this boundary as plain
JSON dicts: the official client's `kubernetes.aio` transport is used with
`*_without_preload_content`, which keeps the hot watch path free of model validation and
tolerant of fields newer than the client's models.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import aiohttp
from kubernetes.aio import client, config, watch

from plugin.errors import KubeApiError, SettingsError

Obj = dict[str, Any]
P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class ApiCall:
    """One kind of request the plugin makes, in RBAC terms."""

    group: str  # "" for the core API
    resource: str  # plural, with subresource: "pods/binding"
    verbs: tuple[str, ...]
    namespace: str = ""  # "" across the cluster; else the one namespace the call is made in


PLUGIN_NAMESPACE = "kdrl-system"  # where the plugin keeps its lease and runs pre-pull pods
API_CALLS: list[ApiCall] = []
LOOP_CALLS: list[ApiCall] = []  # `kdrl loop` and `kdrl rollback --configmap`, under their own account


def api_call(
    group: str, resource: str, *verbs: str, namespace: str = "", registry: list[ApiCall] = API_CALLS
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Declare the API request(s) a function makes; see the module docstring."""

    def register(fn: Callable[P, R]) -> Callable[P, R]:
        registry.append(ApiCall(group=group, resource=resource, verbs=verbs, namespace=namespace))
        return fn

    return register


async def connect(*, api_url: str | None, kubeconfig: Path | None) -> client.ApiClient:
    """An API client: an explicit URL, else in-cluster credentials, else a kubeconfig."""
    configuration = client.Configuration()
    try:
        if api_url:
            configuration.host = api_url
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        else:
            await config.load_kube_config(
                config_file=str(kubeconfig) if kubeconfig else None,
                client_configuration=configuration,
            )
    except (config.ConfigException, OSError, ValueError) as error:
        where = kubeconfig or "~/.kube/config"
        raise SettingsError(
            f"no Kubernetes connection: {error} (set KDRL_KUBE_API_URL, or KDRL_KUBECONFIG for a "
            f"kubeconfig other than {where}, or run in a cluster)"
        ) from error
    return client.ApiClient(configuration)


async def using(
    call: Callable[[client.ApiClient], Awaitable[R]], *, api_url: str | None, kubeconfig: Path | None
) -> R:
    """`call` with a client of its own, closed after it (the one-shot commands' way in)."""
    api = await connect(api_url=api_url, kubeconfig=kubeconfig)
    try:
        return await call(api)
    finally:
        await api.close()


@api_call("", "nodes", "list", "watch")
def nodes(api: client.ApiClient) -> Collection:
    return Collection("nodes", client.CoreV1Api(api).list_node)


@api_call("", "pods", "list", "watch")
def placed_pods(api: client.ApiClient) -> Collection:
    """Pods across namespaces that have a node."""
    lister = client.CoreV1Api(api).list_pod_for_all_namespaces
    return Collection("pods", lister, query=(("field_selector", "spec.nodeName!="),))


@dataclass(frozen=True)
class Collection:
    """A list+watch-able collection: the client's list method with its arguments."""

    name: str
    lister: Callable[..., Awaitable[Any]]
    args: tuple[Any, ...] = ()
    query: tuple[tuple[str, str], ...] = ()
    absent: str = ""  # what a 404 on the collection means to an operator ("" : a failure like any)


@api_call("eventing.knative.dev", "triggers", "list", "watch")
def triggers(api: client.ApiClient) -> Collection:
    lister = client.CustomObjectsApi(api).list_cluster_custom_object
    return Collection(
        "triggers",
        lister,
        ("eventing.knative.dev", "v1", "triggers"),
        absent="Knative Eventing is not installed: counting invocations from Triggers is off",
    )


async def list_objects(collection: Collection, *, timeout_s: float) -> tuple[list[Obj], str]:
    """All items of a collection and the list's resourceVersion."""
    lister = collection.lister
    raw = getattr(lister.__self__, f"{lister.__name__}_without_preload_content")  # type: ignore[attr-defined]
    try:
        response = await raw(*collection.args, _request_timeout=timeout_s, **dict(collection.query))
        async with response:
            body = await response.read()
            status = response.status
    except (aiohttp.ClientError, TimeoutError, OSError) as error:
        raise KubeApiError(f"list failed: {error or type(error).__name__}") from error
    if status != 200:
        raise KubeApiError(f"list failed: {_status_message(body)}", status=status)
    document = json.loads(body)
    return list(document.get("items") or []), str(document["metadata"]["resourceVersion"])


async def watch_objects(
    collection: Collection, *, resource_version: str, timeout_s: int
) -> AsyncIterator[tuple[str, Obj]]:
    """(type, object) events after `resource_version` until the server ends the stream.

    A 410 Gone (history compacted) raises `KubeApiError(status=410)`: the caller relists.
    """
    stream = watch.Watch(return_type="object")
    try:
        async for event in stream.stream(
            collection.lister,
            *collection.args,
            resource_version=resource_version,
            timeout_seconds=timeout_s,
            allow_watch_bookmarks=True,
            **dict(collection.query),
        ):
            yield str(event["type"]), event["raw_object"]
    except client.ApiException as error:
        raise KubeApiError(f"watch failed: {error.reason}", status=error.status) from error
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as error:
        raise KubeApiError(f"watch failed: {error or type(error).__name__}") from error
    finally:
        await stream.close()


@api_call("", "pods", "get")
async def get_pod(api: client.ApiClient, *, namespace: str, name: str, timeout_s: float) -> Obj:
    """A pod as the API server has it now (bind checks who schedules it before binding)."""
    core = client.CoreV1Api(api)
    return await _read(
        core.read_namespaced_pod_without_preload_content(name, namespace, _request_timeout=timeout_s),
        f"get pod {namespace}/{name}",
    )


@api_call("", "pods/binding", "create")
async def bind_pod(
    api: client.ApiClient, *, namespace: str, name: str, uid: str, node: str, timeout_s: float
) -> None:
    """Bind a pod to a node; raises `KubeApiError` with the API server's own message.

    The server answers 201 with a `Status`, which the generated client cannot read as the
    `V1Binding` its OpenAPI spec promises (kubernetes-client/python #547, #825): the raw
    response is read instead.
    """
    body = client.V1Binding(
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, uid=uid or None),
        target=client.V1ObjectReference(api_version="v1", kind="Node", name=node),
    )
    core = client.CoreV1Api(api)
    try:
        response = await core.create_namespaced_pod_binding_without_preload_content(
            name, namespace, body, _request_timeout=timeout_s
        )
        async with response:
            status, text = response.status, await response.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as error:
        raise KubeApiError(
            f"binding {namespace}/{name} to {node} failed: {error or type(error).__name__}"
        ) from error
    if status not in (200, 201):
        raise KubeApiError(
            f"binding {namespace}/{name} to {node} failed: {_status_message(text)}", status=status
        )


SERVING = ("serving.knative.dev", "v1")


@api_call("serving.knative.dev", "revisions", "list")
def revisions(api: client.ApiClient) -> Collection:
    lister = client.CustomObjectsApi(api).list_cluster_custom_object
    return Collection("revisions", lister, ("serving.knative.dev", "v1", "revisions"))


@api_call("apps", "deployments", "get", namespace="knative-serving")
async def serving_version(api: client.ApiClient, *, timeout_s: float) -> str:
    """Knative Serving's release, from its controller Deployment's version label ("" if unknown)."""
    apps = client.AppsV1Api(api)
    deployment = await _read(
        apps.read_namespaced_deployment_without_preload_content(
            "controller", "knative-serving", _request_timeout=timeout_s
        ),
        "get deployment knative-serving/controller",
    )
    labels = (deployment.get("metadata") or {}).get("labels") or {}
    return str(labels.get("app.kubernetes.io/version") or labels.get("serving.knative.dev/release") or "")


@api_call("caching.internal.knative.dev", "images", "list", "watch")
def knative_images(api: client.ApiClient) -> Collection:
    """Knative's image cache objects: one per revision container, the image by digest."""
    lister = client.CustomObjectsApi(api).list_cluster_custom_object
    return Collection("images", lister, ("caching.internal.knative.dev", "v1alpha1", "images"))


@api_call("serving.knative.dev", "services", "list", "watch")
def services(api: client.ApiClient) -> Collection:
    lister = client.CustomObjectsApi(api).list_cluster_custom_object
    return Collection("services", lister, ("serving.knative.dev", "v1", "services"))


@api_call("serving.knative.dev", "services", "get")
async def get_service(api: client.ApiClient, *, namespace: str, name: str, timeout_s: float) -> Obj:
    """A Knative Service (its `status.traffic` names the routed revisions)."""
    return await _get_serving(api, "services", namespace, name, timeout_s)


@api_call("serving.knative.dev", "revisions", "get")
async def get_revision(api: client.ApiClient, *, namespace: str, name: str, timeout_s: float) -> Obj:
    return await _get_serving(api, "revisions", namespace, name, timeout_s)


async def _get_serving(
    api: client.ApiClient, plural: str, namespace: str, name: str, timeout_s: float
) -> Obj:
    custom = client.CustomObjectsApi(api)
    return await _read(
        custom.get_namespaced_custom_object_without_preload_content(
            *SERVING, namespace, plural, name, _request_timeout=timeout_s
        ),
        f"get {plural.removesuffix('s')} {namespace}/{name}",
    )


@api_call("serving.knative.dev", "revisions", "patch")
async def patch_revision(
    api: client.ApiClient, *, namespace: str, name: str, patch: Obj, resource_version: str, timeout_s: float
) -> Obj:
    """JSON merge patch of a Revision, guarded by `resourceVersion` (a 409 when it changed)."""
    guarded = {**patch, "metadata": {**patch.get("metadata", {}), "resourceVersion": resource_version}}
    custom = client.CustomObjectsApi(api)
    call = custom.patch_namespaced_custom_object_without_preload_content(
        *SERVING,
        namespace,
        "revisions",
        name,
        guarded,
        _request_timeout=timeout_s,
        _content_type="application/merge-patch+json",
    )
    return await _read(call, f"patch revision {namespace}/{name}")


@api_call("coordination.k8s.io", "leases", "get", namespace=PLUGIN_NAMESPACE)
async def get_lease(api: client.ApiClient, *, namespace: str, name: str, timeout_s: float) -> Obj:
    coordination = client.CoordinationV1Api(api)
    return await _read(
        coordination.read_namespaced_lease_without_preload_content(
            name, namespace, _request_timeout=timeout_s
        ),
        f"get lease {namespace}/{name}",
    )


@api_call("coordination.k8s.io", "leases", "create", "update", namespace=PLUGIN_NAMESPACE)
async def write_lease(
    api: client.ApiClient,
    *,
    namespace: str,
    name: str,
    spec: Obj,
    resource_version: str | None,
    timeout_s: float,
) -> Obj:
    """Create the lease (no `resource_version`) or replace it guarded by its version (409: lost)."""
    metadata: Obj = {"name": name, "namespace": namespace}
    if resource_version:
        metadata["resourceVersion"] = resource_version
    body: Any = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}
    coordination = client.CoordinationV1Api(api)
    if resource_version:
        call = coordination.replace_namespaced_lease_without_preload_content(
            name, namespace, body, _request_timeout=timeout_s
        )
    else:
        call = coordination.create_namespaced_lease_without_preload_content(
            namespace, body, _request_timeout=timeout_s
        )
    return await _read(call, f"write lease {namespace}/{name}", ok=(200, 201))


@api_call("", "configmaps", "get", namespace=PLUGIN_NAMESPACE, registry=LOOP_CALLS)
async def get_configmap(api: client.ApiClient, *, namespace: str, name: str, timeout_s: float) -> Obj:
    core = client.CoreV1Api(api)
    return await _read(
        core.read_namespaced_config_map_without_preload_content(name, namespace, _request_timeout=timeout_s),
        f"get configmap {namespace}/{name}",
    )


@api_call("", "configmaps", "update", namespace=PLUGIN_NAMESPACE, registry=LOOP_CALLS)
async def replace_configmap(api: client.ApiClient, *, body: Obj, timeout_s: float) -> Obj:
    """Replace, guarded by the body's resourceVersion (409: changed since it was read)."""
    meta = body["metadata"]
    core = client.CoreV1Api(api)
    raw: Any = body  # sent as the JSON it is (the client serialises dicts as they are)
    return await _read(
        core.replace_namespaced_config_map_without_preload_content(
            meta["name"], meta["namespace"], raw, _request_timeout=timeout_s
        ),
        f"replace configmap {meta['namespace']}/{meta['name']}",
    )


@api_call("", "events", "create")
async def create_event(api: client.ApiClient, *, namespace: str, body: Obj, timeout_s: float) -> Obj:
    """Record a Kubernetes Event (what `kubectl describe` shows about an object)."""
    create = client.CoreV1Api(api).create_namespaced_event_without_preload_content
    return await _create(create, namespace, body, "event", timeout_s)


@api_call("", "pods", "create", namespace=PLUGIN_NAMESPACE)
async def create_pod(api: client.ApiClient, *, namespace: str, body: Obj, timeout_s: float) -> Obj:
    """Create a pod (the plugin's pre-pull pods, in its own namespace); 409 when it exists."""
    create = client.CoreV1Api(api).create_namespaced_pod_without_preload_content
    return await _create(create, namespace, body, "pod", timeout_s)


async def _create(create: Callable[..., Any], namespace: str, body: Obj, kind: str, timeout_s: float) -> Obj:
    payload: Any = body
    what = f"create {kind} {namespace}/{body['metadata']['name']}"
    return await _read(create(namespace, payload, _request_timeout=timeout_s), what, ok=(200, 201))


@api_call("", "pods", "delete", namespace=PLUGIN_NAMESPACE)
async def delete_pod(api: client.ApiClient, *, namespace: str, name: str, timeout_s: float) -> None:
    """Delete a pod; one already gone is fine (its work is done either way)."""
    core = client.CoreV1Api(api)
    try:
        await _read(
            core.delete_namespaced_pod_without_preload_content(name, namespace, _request_timeout=timeout_s),
            f"delete pod {namespace}/{name}",
            ok=(200, 202),
        )
    except KubeApiError as error:
        if error.status != 404:
            raise


def labelled_pods(api: client.ApiClient, namespace: str, selector: str) -> Collection:
    """Pods of one namespace with a label selector (the plugin's own pre-pull pods)."""
    lister = client.CoreV1Api(api).list_namespaced_pod
    return Collection("pods", lister, (namespace,), query=(("label_selector", selector),))


async def _read(call: Awaitable[Any], what: str, ok: tuple[int, ...] = (200,)) -> Obj:
    try:
        response = await call
        async with response:
            status, body = response.status, await response.read()
    except (aiohttp.ClientError, TimeoutError, OSError) as error:
        raise KubeApiError(f"{what} failed: {error or type(error).__name__}") from error
    if status not in ok:
        raise KubeApiError(f"{what} failed: {_status_message(body)}", status=status)
    result: Obj = json.loads(body)
    return result


def _status_message(body: bytes) -> str:
    """The `message` of a Kubernetes `Status` body, or the body itself."""
    try:
        status = json.loads(body)
        return str(status.get("message") or status.get("reason") or status)
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")
