"""What the plugin knows of the cluster: nodes, and the pods placed on them.

`Inventory` is the mutable side of the cluster cache. Watch events (or static files) go in
one object at a time; `table()` packs it into an immutable `NodeTable` for the request path.
Per-node usage is kept as running sums, so an event costs O(1). A snapshot reuses the table of
the nodes themselves (names, labels, taints, images: rebuilt only when a node changes) and
fills in usage from the running sums, so the pod events of a busy cluster (several a second
per bound pod) do not rebuild every node row each time. It holds no I/O and no clock: the
cache decides when to publish.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from plugin import convert
from plugin.errors import ObjectError
from policies.types import USAGE_COLUMNS, Node, NodeTable, PodRequest

logger = logging.getLogger(__name__)

_FINISHED_PHASES = frozenset({"Succeeded", "Failed"})  # they no longer hold their requests


@dataclass(slots=True)
class _Usage:
    cpu: int = 0
    memory: int = 0
    gpu: int = 0
    cpu_nonzero: int = 0
    memory_nonzero: int = 0
    pods: int = 0
    functions: dict[str, int] = field(default_factory=dict)

    def columns(self) -> tuple[int, int, int, int, int, int]:
        """In the order of `USAGE_COLUMNS`."""
        return self.cpu, self.memory, self.gpu, self.cpu_nonzero, self.memory_nonzero, self.pods

    def add(self, pod: PodRequest, sign: int) -> None:
        self.cpu += sign * pod.cpu_milli
        self.memory += sign * pod.memory_bytes
        self.gpu += sign * pod.gpu
        self.cpu_nonzero += sign * pod.cpu_milli_nonzero
        self.memory_nonzero += sign * pod.memory_bytes_nonzero
        self.pods += sign
        if pod.function:
            count = self.functions.get(pod.function, 0) + sign
            if count > 0:
                self.functions[pod.function] = count
            else:
                self.functions.pop(pod.function, None)


@dataclass(slots=True)
class Inventory:
    """Nodes by name and placed pods by uid, with running per-node usage."""

    nodes: dict[str, Node] = field(default_factory=dict)
    pods: dict[str, tuple[str, PodRequest]] = field(default_factory=dict)  # uid -> (node, pod)
    usage: dict[str, _Usage] = field(default_factory=dict)
    _nodes_table: NodeTable | None = None  # the nodes alone, sorted by name; None: to rebuild
    _rows: dict[str, int] = field(default_factory=dict)  # node name -> its row there

    def upsert_node(self, obj: Mapping[str, Any]) -> None:
        try:
            node = convert.node_row(obj)
        except ObjectError as error:
            logger.warning("ignoring a malformed node: %s", error)
            return
        self.nodes[node.name] = node
        self._nodes_table = None

    def delete_node(self, obj: Mapping[str, Any]) -> None:
        name = obj.get("metadata", {}).get("name")
        if self.nodes.pop(str(name), None) is not None:
            self._nodes_table = None

    def upsert_pod(self, obj: Mapping[str, Any]) -> None:
        """Account a pod on its node; a pod without a node, or finished, holds nothing."""
        meta = obj.get("metadata") or {}
        uid = str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")
        node = (obj.get("spec") or {}).get("nodeName")
        phase = (obj.get("status") or {}).get("phase")
        if not node or phase in _FINISHED_PHASES:
            self.forget_pod(uid)
            return
        try:
            pod = convert.pod_request(obj)
        except ObjectError as error:
            logger.warning("ignoring a malformed pod %s: %s", uid, error)
            return
        self.place(uid, str(node), pod)

    def delete_pod(self, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        self.forget_pod(str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}"))

    def place(self, uid: str, node: str, pod: PodRequest) -> None:
        """Count `pod` on `node` (also used to assume a pod right after binding it)."""
        self.forget_pod(uid)
        self.pods[uid] = (node, pod)
        self.usage.setdefault(node, _Usage()).add(pod, +1)

    def forget_pod(self, uid: str) -> None:
        placed = self.pods.pop(uid, None)
        if placed is None:
            return
        node, pod = placed
        usage = self.usage[node]
        usage.add(pod, -1)
        if usage.pods == 0:
            del self.usage[node]

    def clear_nodes(self) -> None:
        self.nodes.clear()
        self._nodes_table = None

    def clear_pods(self) -> None:
        self.pods.clear()
        self.usage.clear()

    def table(self) -> NodeTable:
        """Nodes sorted by name, with their pods' requests summed in."""
        if self._nodes_table is None:
            ordered = sorted(self.nodes)
            self._nodes_table = NodeTable.from_nodes([self.nodes[name] for name in ordered])
            self._rows = {name: row for row, name in enumerate(ordered)}
        base = self._nodes_table
        size = len(base)
        columns: dict[str, Any] = {c: np.zeros(size, dtype=np.int64) for c in USAGE_COLUMNS}
        function_pods = np.fromiter(({} for _ in range(size)), dtype=object, count=size)
        for name, usage in self.usage.items():
            row = self._rows.get(name)
            if row is None:  # pods on a node the cache does not know (yet)
                continue
            for column, value in zip(USAGE_COLUMNS, usage.columns()):
                columns[column][row] = value
            function_pods[row] = dict(usage.functions)
        function_pods.flags.writeable = False
        # Only usage changes: every other column and object is the nodes' table's own.
        cluster = dataclasses.replace(
            base.cluster, function_pods=function_pods, known_economics=base.cluster.economics
        )
        return dataclasses.replace(base, cluster=cluster, **columns)
