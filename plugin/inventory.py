"""What the plugin knows of the cluster: nodes, and the pods placed on them.

`Inventory` is the mutable side of the cluster cache. Watch events (or static files) go in
one object at a time; `table()` packs it into an immutable `NodeTable` for the request path.
Per-node usage is kept as running sums, so an event costs O(1) and a snapshot O(nodes).
It holds no I/O and no clock: the cache decides when to publish.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from plugin import convert
from plugin.errors import ObjectError
from policies.types import Node, NodeTable, PodRequest

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

    def upsert_node(self, obj: Mapping[str, Any]) -> None:
        try:
            node = convert.node_row(obj)
        except ObjectError as error:
            logger.warning("ignoring a malformed node: %s", error)
            return
        self.nodes[node.name] = node

    def delete_node(self, obj: Mapping[str, Any]) -> None:
        name = obj.get("metadata", {}).get("name")
        self.nodes.pop(str(name), None)

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

    def clear_pods(self) -> None:
        self.pods.clear()
        self.usage.clear()

    def table(self) -> NodeTable:
        """Nodes sorted by name, with their pods' requests summed in."""
        rows = []
        for name in sorted(self.nodes):
            node = self.nodes[name]
            usage = self.usage.get(name)
            if usage is not None:
                node = dataclasses.replace(
                    node,
                    cpu_requested=usage.cpu,
                    memory_requested=usage.memory,
                    gpu_requested=usage.gpu,
                    cpu_nonzero_requested=usage.cpu_nonzero,
                    memory_nonzero_requested=usage.memory_nonzero,
                    pod_count=usage.pods,
                    function_pods=dict(usage.functions),
                )
            rows.append(node)
        return NodeTable.from_nodes(rows)
