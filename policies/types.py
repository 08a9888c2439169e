"""The cluster as a placement policy sees it: one pending pod and a columnar table of nodes.

These are plain values built once at the edge (from Kubernetes JSON in `plugin/`, from the
simulator's state in `simulator/`). Nothing here knows where the data came from.
Units follow the project's conventions: CPU in millicores, memory and image sizes in bytes.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from policies.economics import NodeEconomics

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]
ObjectArray = npt.NDArray[np.object_]


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
    expected_lifetime_s: float = 0.0  # from the forecaster where known; 0: unknown

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


# What the pods on a node add up to (the rest of a row describes the node itself).
USAGE_COLUMNS = (
    "cpu_requested",
    "memory_requested",
    "gpu_requested",
    "cpu_nonzero_requested",
    "memory_nonzero_requested",
    "pod_count",
)
_INT_COLUMNS = (
    "cpu_allocatable",
    "memory_allocatable",
    "pods_allocatable",
    "gpu_allocatable",
    *USAGE_COLUMNS,
)
_BOOL_COLUMNS = ("unschedulable",)
ROW_COLUMNS = (*_INT_COLUMNS, *_BOOL_COLUMNS, "taint_set")  # every per-row array but `origin`
_FROZEN_COLUMNS = (*ROW_COLUMNS, "origin")


@dataclass(frozen=True, eq=False)
class ClusterObjects:
    """Per-node Python objects and the image index of the whole cluster.

    Shared by the cluster's table and every subset taken from it, so a subset costs only
    its numeric columns; subsets reach these through their `origin` rows.
    """

    names: ObjectArray
    labels: ObjectArray  # Mapping[str, str] per node
    taints: ObjectArray  # tuple[Taint, ...] per node
    images: ObjectArray  # Mapping[str, int] per node: image name -> size in bytes
    function_pods: ObjectArray  # Mapping[str, int] per node: function -> pods on it
    image_index: Mapping[str, tuple[IntArray, IntArray]]  # image -> (node rows, sizes)
    taint_sets: tuple[tuple[Taint, ...], ...]  # distinct taint sets; the first is "no taints"
    known_economics: NodeEconomics | None = None  # given where already at hand, else read from labels

    @property
    def size(self) -> int:
        return len(self.names)

    @functools.cached_property
    def function_index(self) -> dict[str, tuple[IntArray, IntArray]]:
        """function -> (node rows, its pods on each): built once per cluster, read per request."""
        rows: dict[str, tuple[list[int], list[int]]] = {}
        for row, pods in enumerate(self.function_pods):
            for function, count in pods.items():
                found = rows.setdefault(function, ([], []))
                found[0].append(row)
                found[1].append(count)
        return {f: (np.asarray(r, np.int64), np.asarray(c, np.int64)) for f, (r, c) in rows.items()}

    @functools.cached_property
    def economics(self) -> NodeEconomics:
        """Price, power, spot and zone of every node (read from the labels once)."""
        if self.known_economics is not None:
            return self.known_economics
        from policies.economics import NodeEconomics

        return NodeEconomics.from_labels(self.labels)


@dataclass(frozen=True, eq=False)
class NodeTable:
    """Nodes as columns: one numpy array per numeric attribute, objects through `cluster`.

    A table may be the candidates of one request, a subset of the cluster. `origin` gives
    each row's position in the cluster; the image index describes the whole cluster, because
    ImageLocality scales an image's size by the share of *all* nodes that hold it.
    """

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
    taint_set: IntArray  # index into `cluster.taint_sets`: nodes of a pool share one entry
    origin: IntArray
    cluster: ClusterObjects

    def __post_init__(self) -> None:
        for column in _FROZEN_COLUMNS:
            getattr(self, column).setflags(write=False)

    @classmethod
    def from_nodes(cls, nodes: Sequence[Node]) -> NodeTable:
        size = len(nodes)
        holders: dict[str, tuple[list[int], list[int]]] = {}
        for row, node in enumerate(nodes):
            for image, image_size in node.images.items():
                rows, sizes = holders.setdefault(image, ([], []))
                rows.append(row)
                sizes.append(image_size)
        objects = {
            column: _object_array([getattr(n, attribute) for n in nodes])
            for column, attribute in (
                ("names", "name"),
                ("labels", "labels"),
                ("taints", "taints"),
                ("images", "images"),
                ("function_pods", "function_pods"),
            )
        }
        taint_sets: dict[tuple[Taint, ...], int] = {(): 0}
        taint_set = np.fromiter(
            (taint_sets.setdefault(n.taints, len(taint_sets)) for n in nodes), np.int64, size
        )
        image_index = {
            image: (np.asarray(rows, np.int64), np.asarray(sizes, np.int64))
            for image, (rows, sizes) in holders.items()
        }
        return cls(
            unschedulable=np.fromiter((n.unschedulable for n in nodes), np.bool_, size),
            taint_set=taint_set,
            origin=np.arange(size, dtype=np.int64),
            cluster=ClusterObjects(
                names=objects["names"],
                labels=objects["labels"],
                taints=objects["taints"],
                images=objects["images"],
                function_pods=objects["function_pods"],
                image_index=image_index,
                taint_sets=tuple(taint_sets),
            ),
            **{c: np.fromiter((getattr(n, c) for n in nodes), np.int64, size) for c in _INT_COLUMNS},
        )

    @classmethod
    def empty(cls) -> NodeTable:
        return cls.from_nodes(())

    def __len__(self) -> int:
        return len(self.origin)

    @functools.cached_property
    def names(self) -> ObjectArray:
        return self.cluster.names[self.origin]

    @functools.cached_property
    def labels(self) -> ObjectArray:
        return self.cluster.labels[self.origin]

    @functools.cached_property
    def taints(self) -> ObjectArray:
        return self.cluster.taints[self.origin]

    @functools.cached_property
    def images(self) -> ObjectArray:
        return self.cluster.images[self.origin]

    @functools.cached_property
    def function_pods(self) -> ObjectArray:
        return self.cluster.function_pods[self.origin]

    @functools.cached_property
    def name_list(self) -> list[str]:
        return self.names.tolist()  # type: ignore[no-any-return]

    @functools.cached_property
    def _rows(self) -> dict[str, int]:
        return {name: i for i, name in enumerate(self.names)}

    def row(self, name: str) -> int | None:
        return self._rows.get(name)

    def rows(self, names: Sequence[str]) -> list[int | None]:
        """Row of each name (None where unknown), in one pass."""
        return list(map(self._rows.get, names))

    @property
    def cluster_size(self) -> int:
        return self.cluster.size

    def take(self, rows: Sequence[int] | IntArray) -> NodeTable:
        """The sub-table of the given rows, in that order."""
        index = np.asarray(rows, dtype=np.int64)
        columns = {c: getattr(self, c)[index] for c in ROW_COLUMNS}
        return NodeTable(origin=self.origin[index], cluster=self.cluster, **columns)

    def image_sizes(self, image: str) -> IntArray:
        """Per row, the size of `image` if the node holds it, else 0."""
        holders = self.cluster.image_index.get(image)
        if holders is None:
            return np.zeros(len(self), dtype=np.int64)
        rows, sizes = holders
        cluster = np.zeros(self.cluster.size, dtype=np.int64)
        cluster[rows] = sizes
        return cluster[self.origin]

    def function_pod_counts(self, function: str) -> IntArray:
        """Per row, how many pods of `function` run on the node."""
        found = self.cluster.function_index.get(function)
        if found is None:
            return np.zeros(len(self), dtype=np.int64)
        cluster = np.zeros(self.cluster.size, dtype=np.int64)
        cluster[found[0]] = found[1]
        return cluster[self.origin]

    def image_spread(self, image: str) -> float:
        """The share of all cluster nodes that hold `image`."""
        holders = self.cluster.image_index.get(image)
        return 0.0 if holders is None else len(holders[0]) / self.cluster.size

    def node(self, row: int) -> Node:
        """One row back as a `Node` (for explanations and tests, not for hot paths)."""
        ints = {c: int(getattr(self, c)[row]) for c in _INT_COLUMNS}
        return Node(
            name=str(self.names[row]),
            unschedulable=bool(self.unschedulable[row]),
            labels=self.labels[row],
            taints=self.taints[row],
            images=self.images[row],
            function_pods=self.function_pods[row],
            **ints,
        )


def _object_array(values: list[Any]) -> ObjectArray:
    array = np.fromiter(values, dtype=object, count=len(values))  # tuples stay single items
    array.flags.writeable = False
    return array
