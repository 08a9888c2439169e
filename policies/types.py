"""The cluster as a placement policy sees it: one pending pod and a columnar table of nodes.

These are plain values built once at the edge (from Kubernetes JSON in `plugin/`, from the
simulator's state in `simulator/`). Nothing here knows where the data came from.
Units follow the project's conventions: CPU in millicores, memory and image sizes in bytes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


class Priority(enum.Enum):
    """A function's priority class, from the `kdrl.dev/priority` annotation."""

    CRITICAL = "critical"
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"
    BATCH = "batch"


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"  # NoSchedule | PreferNoSchedule | NoExecute


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""  # empty key with operator Exists tolerates every taint
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # empty matches every effect

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.value == taint.value  # "Equal", also when the operator is left empty


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    """One `matchExpressions` (or `matchFields`, with key `metadata.name`) entry."""

    key: str
    operator: str  # In | NotIn | Exists | DoesNotExist | Gt | Lt
    values: tuple[str, ...] = ()
    on_field: bool = False  # a matchFields entry: the key names a node field, not a label

    def matches(self, labels: Mapping[str, str], node_name: str) -> bool:
        if self.on_field:
            value: str | None = node_name if self.key == "metadata.name" else None
        else:
            value = labels.get(self.key)
        match self.operator:
            case "In":
                return value is not None and value in self.values
            case "NotIn":
                return value is None or value not in self.values
            case "Exists":
                return value is not None
            case "DoesNotExist":
                return value is None
            case "Gt" | "Lt":
                return _compare_integer(value, self.values, greater=self.operator == "Gt")
        return False  # an unknown operator never matches, as upstream rejects it


def _compare_integer(value: str | None, values: tuple[str, ...], *, greater: bool) -> bool:
    if value is None or len(values) != 1:
        return False
    try:
        left, right = int(value), int(values[0])
    except ValueError:
        return False
    return left > right if greater else left < right


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    """Requirements ANDed together; the terms of a required affinity are ORed."""

    requirements: tuple[LabelRequirement, ...]

    def matches(self, labels: Mapping[str, str], node_name: str) -> bool:
        # An empty term matches nothing, as in kube-scheduler's nodeaffinity helper.
        return bool(self.requirements) and all(r.matches(labels, node_name) for r in self.requirements)


@dataclass(frozen=True, slots=True)
class PodRequest:
    """One pending pod, reduced to what placement needs."""

    namespace: str
    name: str
    uid: str = ""
    function: str | None = None  # "namespace/service" of the Knative Service
    revision: str | None = None
    priority: Priority = Priority.NORMAL
    cpu_milli: int = 0
    memory_bytes: int = 0
    gpu: int = 0
    # Requests with kube-scheduler's defaults for containers that request nothing
    # (100m CPU / 200 MiB), which is what its resource *scoring* uses.
    cpu_milli_nonzero: int = 0
    memory_bytes_nonzero: int = 0
    images: tuple[str, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    required_affinity: tuple[NodeSelectorTerm, ...] = ()
    tolerations: tuple[Toleration, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Node:
    """One node as a row: what the cache knows, before it is packed into a `NodeTable`."""

    name: str
    cpu_allocatable: int
    memory_allocatable: int
    pods_allocatable: int = 110
    gpu_allocatable: int = 0
    cpu_requested: int = 0
    memory_requested: int = 0
    gpu_requested: int = 0
    cpu_nonzero_requested: int = 0
    memory_nonzero_requested: int = 0
    pod_count: int = 0
    unschedulable: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    images: Mapping[str, int] = field(default_factory=dict)  # every image name -> size in bytes
    function_pods: Mapping[str, int] = field(default_factory=dict)  # function -> pods on node


_INT_COLUMNS = (
    "cpu_allocatable",
    "memory_allocatable",
    "pods_allocatable",
    "gpu_allocatable",
    "cpu_requested",
    "memory_requested",
    "gpu_requested",
    "cpu_nonzero_requested",
    "memory_nonzero_requested",
    "pod_count",
)


@dataclass(frozen=True, eq=False)
class NodeTable:
    """Nodes as columns: one numpy array per numeric attribute, one tuple per mapping.

    A table may be a subset of the cluster (the candidates of one request); `image_spread`
    and `cluster_size` still describe the whole cluster, because ImageLocality scales an
    image's size by the share of *all* nodes that hold it.
    """

    names: tuple[str, ...]
    cpu_allocatable: IntArray
    memory_allocatable: IntArray
    pods_allocatable: IntArray
    gpu_allocatable: IntArray
    cpu_requested: IntArray
    memory_requested: IntArray
    gpu_requested: IntArray
    cpu_nonzero_requested: IntArray
    memory_nonzero_requested: IntArray
    pod_count: IntArray
    unschedulable: BoolArray
    labels: tuple[Mapping[str, str], ...]
    taints: tuple[tuple[Taint, ...], ...]
    images: tuple[Mapping[str, int], ...]
    function_pods: tuple[Mapping[str, int], ...]
    image_spread: Mapping[str, float]
    cluster_size: int
    _rows: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_rows", {name: i for i, name in enumerate(self.names)})
        for column in _INT_COLUMNS:
            getattr(self, column).flags.writeable = False
        self.unschedulable.flags.writeable = False

    @classmethod
    def from_nodes(cls, nodes: Sequence[Node]) -> NodeTable:
        holders: dict[str, int] = {}
        for node in nodes:
            for image in node.images:
                holders[image] = holders.get(image, 0) + 1
        size = len(nodes)
        columns = {c: np.fromiter((getattr(n, c) for n in nodes), np.int64, size) for c in _INT_COLUMNS}
        return cls(
            names=tuple(n.name for n in nodes),
            unschedulable=np.fromiter((n.unschedulable for n in nodes), np.bool_, size),
            labels=tuple(n.labels for n in nodes),
            taints=tuple(n.taints for n in nodes),
            images=tuple(n.images for n in nodes),
            function_pods=tuple(n.function_pods for n in nodes),
            image_spread={image: count / size for image, count in holders.items()},
            cluster_size=size,
            **columns,
        )

    @classmethod
    def empty(cls) -> NodeTable:
        return cls.from_nodes(())

    def __len__(self) -> int:
        return len(self.names)

    def row(self, name: str) -> int | None:
        return self._rows.get(name)

    def take(self, rows: Sequence[int] | IntArray) -> NodeTable:
        """The sub-table of the given rows, in that order."""
        index = np.asarray(rows, dtype=np.int64)
        picked = [int(i) for i in index]
        columns = {c: getattr(self, c)[index] for c in _INT_COLUMNS}
        return NodeTable(
            names=tuple(self.names[i] for i in picked),
            unschedulable=self.unschedulable[index],
            labels=tuple(self.labels[i] for i in picked),
            taints=tuple(self.taints[i] for i in picked),
            images=tuple(self.images[i] for i in picked),
            function_pods=tuple(self.function_pods[i] for i in picked),
            image_spread=self.image_spread,
            cluster_size=self.cluster_size,
            **columns,
        )

    def node(self, row: int) -> Node:
        """One row back as a `Node` (for explanations and tests, not for hot paths)."""
        ints = {c: int(getattr(self, c)[row]) for c in _INT_COLUMNS}
        return Node(
            name=self.names[row],
            unschedulable=bool(self.unschedulable[row]),
            labels=self.labels[row],
            taints=self.taints[row],
            images=self.images[row],
            function_pods=self.function_pods[row],
            **ints,
        )
