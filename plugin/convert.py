"""Kubernetes JSON (pods, nodes) into the policy types, once, at the edge.

Objects arrive as plain JSON from the extender request, the watch stream or a `kubectl get
-o json` file. Every field is checked for its type; a wrong one raises `ObjectError` naming
its path, so a bad request becomes a 400 that says what is wrong. What this module does not
do: talk to the API server, or decide anything.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from plugin.errors import ObjectError
from policies.types import (
    LabelRequirement,
    Node,
    NodeSelectorTerm,
    PodRequest,
    Priority,
    Taint,
    Toleration,
)

logger = logging.getLogger(__name__)

SCHEDULER_NAME = "kdrl-scheduler"  # the second kube-scheduler the install runs (knative/base)
SERVICE_LABEL = "serving.knative.dev/service"
CONFIGURATION_LABEL = "serving.knative.dev/configuration"
REVISION_LABEL = "serving.knative.dev/revision"
# Kubernetes names (DNS-1123 labels): namespaces, Knative Services and Revisions are named so,
# and only such names reach the history database.
NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
FUNCTION = re.compile(rf"{NAME.pattern}/{NAME.pattern}")  # namespace/service
SUBDOMAIN = re.compile(rf"{NAME.pattern}(\.{NAME.pattern})*")  # pod names, up to 253 characters
PRIORITY_ANNOTATION = "kdrl.dev/priority"
GPU_RESOURCE = "nvidia.com/gpu"

# kube-scheduler's scoring defaults for containers that request nothing
# (pkg/scheduler/util/pod_resources.go): 100m CPU and 200 MiB.
DEFAULT_CPU_MILLI = 100
DEFAULT_MEMORY_BYTES = 200 * 1024 * 1024

# Far beyond any real node (1M cores, 1 EiB, 4096 GPUs): larger values are typos or attacks.
MAX_CPU_MILLI = 10**9
MAX_MEMORY_BYTES = 2**60
MAX_IMAGE_BYTES = 2**50  # a petabyte image: far beyond any registry's, far inside int64
MAX_GPUS = 4096
MAX_PODS = 10**6

Json = Mapping[str, Any]


def pod_request(pod: Json) -> PodRequest:
    """The `PodRequest` of a v1 Pod object."""
    meta = _mapping(pod, "metadata", "pod")
    spec = _mapping(pod, "spec", "pod")
    namespace = _str(meta, "namespace", "pod.metadata") or "default"
    name = _str(meta, "name", "pod.metadata")
    labels = _str_map(meta, "labels", "pod.metadata")
    annotations = _str_map(meta, "annotations", "pod.metadata")
    requests = _pod_resources(spec)
    return PodRequest(
        namespace=namespace,
        name=name,
        uid=_str(meta, "uid", "pod.metadata"),
        function=function_of(namespace, labels),
        revision=labels.get(REVISION_LABEL),
        priority=priority_of(annotations, f"{namespace}/{name}"),
        cpu_milli=requests.cpu,
        memory_bytes=requests.memory,
        gpu=requests.gpu,
        cpu_milli_nonzero=requests.cpu_nz,
        memory_bytes_nonzero=requests.memory_nz,
        images=tuple(
            normalize_image(_str(c, "image", f"pod.spec.{kind}[{i}]"))
            for kind in ("initContainers", "containers")
            for i, c in enumerate(_list(spec, kind, "pod.spec"))
        ),
        node_selector=_str_map(spec, "nodeSelector", "pod.spec"),
        required_affinity=_required_affinity(spec),
        tolerations=tuple(_toleration(t, i) for i, t in enumerate(_list(spec, "tolerations", "pod.spec"))),
    )


def object_key(obj: Json) -> str:
    """`namespace/name` of an object (`default` when it names no namespace)."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"


def function_of(namespace: str, labels: Mapping[str, str]) -> str | None:
    """`namespace/service` for Knative pods (the Configuration for a bare one), else None."""
    owner = labels.get(SERVICE_LABEL) or labels.get(CONFIGURATION_LABEL)
    return f"{namespace}/{owner}" if owner and isinstance(owner, str) else None


def priority_of(annotations: Mapping[str, str], who: str) -> Priority:
    raw = annotations.get(PRIORITY_ANNOTATION)
    if raw is None:
        return Priority.NORMAL
    try:
        return Priority(raw.strip().lower())
    except ValueError:
        _warn_unknown_priority(who, raw)
        return Priority.NORMAL


@functools.lru_cache(maxsize=1024)
def _warn_unknown_priority(who: str, raw: str) -> None:
    """Once per pod and value: the watch sees the same pod many times."""
    known = "|".join(p.value for p in Priority)
    logger.warning("%s: %s=%r is not one of %s; using normal", who, PRIORITY_ANNOTATION, raw, known)


def normalize_image(reference: str) -> str:
    """Append `:latest` to untagged, undigested references, as kube-scheduler does."""
    if "@" in reference:
        return reference
    last = reference.rsplit("/", 1)[-1]
    return reference if ":" in last else f"{reference}:latest"


def node_row(node: Json) -> Node:
    """A `Node` from a v1 Node object, with nothing requested yet (pods are added later)."""
    meta = _mapping(node, "metadata", "node")
    spec = _mapping(node, "spec", "node")
    status = _mapping(node, "status", "node")
    allocatable = _mapping(status, "allocatable", "node.status")
    where = "node.status.allocatable"
    return Node(
        name=_str(meta, "name", "node.metadata"),
        cpu_allocatable=_quantity(
            allocatable.get("cpu", "0"), f"{where}.cpu", milli=True, limit=MAX_CPU_MILLI
        ),
        memory_allocatable=_quantity(
            allocatable.get("memory", "0"), f"{where}.memory", limit=MAX_MEMORY_BYTES
        ),
        pods_allocatable=_quantity(allocatable.get("pods", "110"), f"{where}.pods", limit=MAX_PODS),
        gpu_allocatable=_quantity(allocatable.get(GPU_RESOURCE, "0"), f"{where}.gpu", limit=MAX_GPUS),
        unschedulable=bool(spec.get("unschedulable", False)),
        labels=_str_map(meta, "labels", "node.metadata"),
        taints=tuple(_taint(t, i) for i, t in enumerate(_list(spec, "taints", "node.spec"))),
        images=_node_images(status),
    )


def _node_images(status: Json) -> dict[str, int]:
    images: dict[str, int] = {}
    for i, entry in enumerate(_list(status, "images", "node.status")):
        path = f"node.status.images[{i}]"
        if not isinstance(entry, Mapping):
            raise ObjectError(path, "expected an object")
        size = entry.get("sizeBytes", 0)
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_IMAGE_BYTES:
            raise ObjectError(f"{path}.sizeBytes", f"expected an integer 0..{MAX_IMAGE_BYTES}, got {size!r}")
        for name in _list(entry, "names", path):
            if isinstance(name, str):
                images[name] = size
    return images


@dataclass(frozen=True, slots=True)
class _Requests:
    """Requests of a container or a sum of them; `*_nz` with the scoring defaults applied."""

    cpu: int = 0
    memory: int = 0
    gpu: int = 0
    cpu_nz: int = 0
    memory_nz: int = 0

    def __add__(self, other: _Requests) -> _Requests:
        return _Requests(
            self.cpu + other.cpu,
            self.memory + other.memory,
            self.gpu + other.gpu,
            self.cpu_nz + other.cpu_nz,
            self.memory_nz + other.memory_nz,
        )

    def max(self, other: _Requests) -> _Requests:
        return _Requests(
            max(self.cpu, other.cpu),
            max(self.memory, other.memory),
            max(self.gpu, other.gpu),
            max(self.cpu_nz, other.cpu_nz),
            max(self.memory_nz, other.memory_nz),
        )


def _pod_resources(spec: Json) -> _Requests:
    """A pod's requests as kube-scheduler sums them (resourcehelper.PodRequests).

    Containers add up; a regular init container runs alone, so it counts by max, together
    with the restartable (sidecar) init containers started before it; sidecars also run
    beside the containers. Pod-level requests (`spec.resources`, PodLevelResources: cpu and
    memory) replace that sum where set, for fitting and scoring alike; other resources still
    come from the containers. Pod overhead (RuntimeClass) is added on top.
    """
    sidecars = init_peak = _Requests()
    for i, container in enumerate(_list(spec, "initContainers", "pod.spec")):
        requests = _container_requests(container, f"pod.spec.initContainers[{i}]")
        if container.get("restartPolicy") == "Always":
            sidecars += requests
        else:
            init_peak = init_peak.max(sidecars + requests)
    containers = _Requests()
    for i, container in enumerate(_list(spec, "containers", "pod.spec")):
        containers += _container_requests(container, f"pod.spec.containers[{i}]")
    overhead = _resource_triple(_mapping(spec, "overhead", "pod.spec"), "pod.spec.overhead")
    total = _pod_level((containers + sidecars).max(init_peak), spec) + _Requests(*overhead, *overhead[:2])
    for value, limit, what in (
        (total.cpu, MAX_CPU_MILLI, "cpu"),
        (total.memory, MAX_MEMORY_BYTES, "memory"),
        (total.gpu, MAX_GPUS, "gpu"),
    ):
        if value > limit:
            raise ObjectError("pod.spec", f"total {what} request {value} exceeds any real node ({limit})")
    return total


def _pod_level(aggregated: _Requests, spec: Json) -> _Requests:
    """`aggregated` with the pod-level cpu and memory requests put in where the pod sets them
    (requests default to limits, as the API server defaults them)."""
    resources = _mapping(spec, "resources", "pod.spec")
    limits = _mapping(resources, "limits", "pod.spec.resources")
    given = _mapping(resources, "requests", "pod.spec.resources")
    requests = {r: given.get(r, limits.get(r)) for r in ("cpu", "memory") if r in given or r in limits}
    if not requests:
        return aggregated
    cpu, memory, _ = _resource_triple(requests, "pod.spec.resources.requests")
    return _Requests(
        cpu=cpu if "cpu" in requests else aggregated.cpu,
        memory=memory if "memory" in requests else aggregated.memory,
        gpu=aggregated.gpu,  # not a pod-level resource: the containers' own
        cpu_nz=cpu if "cpu" in requests else aggregated.cpu_nz,
        memory_nz=memory if "memory" in requests else aggregated.memory_nz,
    )


def _container_requests(container: object, path: str) -> _Requests:
    if not isinstance(container, Mapping):
        raise ObjectError(path, "expected an object")
    resources = _mapping(container, "resources", path)
    requests = _mapping(resources, "requests", f"{path}.resources")
    if not requests:
        # The API server defaults requests to limits; files may not have been through it.
        requests = _mapping(resources, "limits", f"{path}.resources")
    cpu, memory, gpu = _resource_triple(requests, f"{path}.resources.requests")
    return _Requests(
        cpu=cpu,
        memory=memory,
        gpu=gpu,
        cpu_nz=cpu if "cpu" in requests else DEFAULT_CPU_MILLI,
        memory_nz=memory if "memory" in requests else DEFAULT_MEMORY_BYTES,
    )


def _resource_triple(resources: Json, path: str) -> tuple[int, int, int]:
    return (
        _quantity(resources.get("cpu", "0"), f"{path}.cpu", milli=True, limit=MAX_CPU_MILLI),
        _quantity(resources.get("memory", "0"), f"{path}.memory", limit=MAX_MEMORY_BYTES),
        _quantity(resources.get(GPU_RESOURCE, "0"), f"{path}.{GPU_RESOURCE}", limit=MAX_GPUS),
    )


def _quantity(raw: object, path: str, *, limit: int, milli: bool = False) -> int:
    """A Kubernetes quantity as an integer (millis when `milli`), rounded up like upstream."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise ObjectError(path, f"expected a quantity such as '500m' or '1Gi', got {raw!r}")
    try:
        value = _parsed_quantity(raw) * (1000 if milli else 1)
    except (ValueError, ArithmeticError) as error:  # ArithmeticError: decimal overflow (1e1000000)
        raise ObjectError(path, str(error)) from None
    if value > limit:
        raise ObjectError(path, f"{raw!r} is larger than any real node")
    return math.ceil(value)


@functools.lru_cache(maxsize=4096)
def _parsed_quantity(raw: str | int | float) -> Decimal:
    """A finite, non-negative quantity; cached because a cluster uses few distinct ones and
    Decimal parsing is a fair share of an extender call."""
    try:
        value = parse_quantity(raw)
    except (ValueError, ArithmeticError, TypeError) as error:  # InvalidOperation, Overflow among them
        raise ValueError(f"{raw!r} is not a Kubernetes quantity") from error
    if not isinstance(value, Decimal) or not value.is_finite():
        raise ValueError(f"{raw!r} is not a finite quantity")
    if value < 0:
        raise ValueError(f"{raw!r} is negative")
    return value


def _required_affinity(spec: Json) -> tuple[NodeSelectorTerm, ...]:
    affinity = _mapping(spec, "affinity", "pod.spec")
    node_affinity = _mapping(affinity, "nodeAffinity", "pod.spec.affinity")
    path = "pod.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    required = _mapping(node_affinity, "requiredDuringSchedulingIgnoredDuringExecution", path)
    terms = []
    for i, term in enumerate(_list(required, "nodeSelectorTerms", path)):
        term_path = f"{path}.nodeSelectorTerms[{i}]"
        if not isinstance(term, Mapping):
            raise ObjectError(term_path, "expected an object")
        requirements = tuple(
            _requirement(r, f"{term_path}.{kind}[{j}]", on_field=kind == "matchFields")
            for kind in ("matchExpressions", "matchFields")
            for j, r in enumerate(_list(term, kind, term_path))
        )
        terms.append(NodeSelectorTerm(requirements=requirements))
    return tuple(terms)


def _requirement(raw: object, path: str, *, on_field: bool) -> LabelRequirement:
    if not isinstance(raw, Mapping):
        raise ObjectError(path, "expected an object")
    values = _list(raw, "values", path)
    if not all(isinstance(v, str) for v in values):
        raise ObjectError(f"{path}.values", "expected a list of strings")
    return LabelRequirement(
        key=_str(raw, "key", path),
        operator=_str(raw, "operator", path),
        values=tuple(values),
        on_field=on_field,
    )


def _toleration(raw: object, index: int) -> Toleration:
    path = f"pod.spec.tolerations[{index}]"
    if not isinstance(raw, Mapping):
        raise ObjectError(path, "expected an object")
    return Toleration(
        key=_str(raw, "key", path),
        operator=_str(raw, "operator", path) or "Equal",
        value=_str(raw, "value", path),
        effect=_str(raw, "effect", path),
    )


def _taint(raw: object, index: int) -> Taint:
    path = f"node.spec.taints[{index}]"
    if not isinstance(raw, Mapping):
        raise ObjectError(path, "expected an object")
    return Taint(key=_str(raw, "key", path), value=_str(raw, "value", path), effect=_str(raw, "effect", path))


def _mapping(obj: Json, key: str, path: str) -> Json:
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ObjectError(f"{path}.{key}", f"expected an object, got {type(value).__name__}")
    return value


def _list(obj: Json, key: str, path: str) -> list[Any]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise ObjectError(f"{path}.{key}", f"expected a list, got {type(value).__name__}")
    return value


def _str(obj: Json, key: str, path: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ObjectError(f"{path}.{key}", f"expected a string, got {type(value).__name__}")
    return value


def _str_map(obj: Json, key: str, path: str) -> dict[str, str]:
    value = _mapping(obj, key, path)
    if not all(isinstance(v, str) for v in value.values()):
        raise ObjectError(f"{path}.{key}", "expected string values")
    return dict(value)
