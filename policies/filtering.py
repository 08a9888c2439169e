"""The one feasibility filter, shared by the extender, `kdrl score` and the simulator.

It mirrors the kube-scheduler Filter plugins a function pod meets: NodeUnschedulable,
TaintToleration, NodeAffinity (nodeSelector and required terms) and NodeResourcesFit (CPU,
memory, `nvidia.com/gpu`, pod count). It does not model volumes, ports, topology spread or
inter-pod affinity: the scheduler's in-tree filters ran before the extender is called.

Resource checks are vectorised; label and taint checks visit only the nodes that need them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from policies.types import BoolArray, NodeTable, PodRequest, Taint, Toleration

# Taint that the node lifecycle controller mirrors from `spec.unschedulable`.
UNSCHEDULABLE_TAINT = Taint(key="node.kubernetes.io/unschedulable", effect="NoSchedule")
_FILTERING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})  # PreferNoSchedule only scores


@dataclass(frozen=True, slots=True)
class Verdicts:
    """Per node: feasible or not, and why not.

    `unresolvable` marks failures that evicting pods cannot fix (taints, labels, cordons):
    the extender reports those as FailedAndUnresolvableNodes so preemption skips them.
    """

    feasible: BoolArray
    unresolvable: BoolArray
    reasons: tuple[str, ...]  # "" where feasible

    def failed(self, names: tuple[str, ...]) -> tuple[dict[str, str], dict[str, str]]:
        """(resolvable, unresolvable) failures as node name -> reason."""
        resolvable: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        for row in np.flatnonzero(~self.feasible):
            target = unresolvable if self.unresolvable[row] else resolvable
            target[names[row]] = self.reasons[row]
        return resolvable, unresolvable


def filter_nodes(pod: PodRequest, nodes: NodeTable) -> Verdicts:
    """Which nodes can run `pod`, with a human-readable reason for each that cannot."""
    size = len(nodes)
    reasons: list[list[str]] = [[] for _ in range(size)]
    unresolvable = np.zeros(size, dtype=np.bool_)
    for row, reason in _label_and_taint_failures(pod, nodes):
        reasons[row].append(reason)
        unresolvable[row] = True
    for row, reason in _resource_failures(pod, nodes):
        reasons[row].append(reason)
    texts = tuple("; ".join(r) for r in reasons)
    feasible = np.fromiter((not t for t in texts), np.bool_, size)
    return Verdicts(feasible=feasible, unresolvable=unresolvable & ~feasible, reasons=texts)


def _label_and_taint_failures(pod: PodRequest, nodes: NodeTable) -> list[tuple[int, str]]:
    failures: list[tuple[int, str]] = []
    if not _tolerated(UNSCHEDULABLE_TAINT, pod.tolerations):
        failures += [
            (int(r), "node is cordoned (spec.unschedulable)") for r in np.flatnonzero(nodes.unschedulable)
        ]
    for row, taints in enumerate(nodes.taints):
        for taint in taints:
            if taint.effect in _FILTERING_EFFECTS and not _tolerated(taint, pod.tolerations):
                failures.append((row, f"untolerated taint {_describe_taint(taint)}"))
    if pod.node_selector or pod.required_affinity:
        for row, (labels, name) in enumerate(zip(nodes.labels, nodes.names)):
            reason = _label_mismatch(pod, labels, name)
            if reason:
                failures.append((row, reason))
    return failures


def _label_mismatch(pod: PodRequest, labels: Mapping[str, str], name: str) -> str:
    for key, value in pod.node_selector.items():
        if labels.get(key) != value:
            return f"nodeSelector {key}={value} does not match the node's labels"
    if pod.required_affinity and not any(t.matches(labels, name) for t in pod.required_affinity):
        return "required node affinity does not match the node's labels"
    return ""


def _tolerated(taint: Taint, tolerations: tuple[Toleration, ...]) -> bool:
    return any(t.tolerates(taint) for t in tolerations)


def _describe_taint(taint: Taint) -> str:
    value = f"={taint.value}" if taint.value else ""
    return f"{taint.key}{value}:{taint.effect}"


def _resource_failures(pod: PodRequest, nodes: NodeTable) -> list[tuple[int, str]]:
    failures: list[tuple[int, str]] = []
    too_many = nodes.pod_count + 1 > nodes.pods_allocatable
    for row in np.flatnonzero(too_many):
        failures.append((int(row), f"too many pods: {nodes.pod_count[row]} of {nodes.pods_allocatable[row]}"))
    checks = (
        ("cpu", pod.cpu_milli, nodes.cpu_requested, nodes.cpu_allocatable, _millicores),
        ("memory", pod.memory_bytes, nodes.memory_requested, nodes.memory_allocatable, _bytes),
        ("nvidia.com/gpu", pod.gpu, nodes.gpu_requested, nodes.gpu_allocatable, str),
    )
    for resource, wanted, requested, allocatable, show in checks:
        if wanted <= 0:
            continue  # NodeResourcesFit skips what the pod does not request
        free = allocatable - requested
        for row in np.flatnonzero(free < wanted):
            failures.append(
                (
                    int(row),
                    f"insufficient {resource}: pod requests {show(wanted)}, node has "
                    f"{show(max(int(free[row]), 0))} free of {show(int(allocatable[row]))}",
                )
            )
    return failures


def _millicores(value: int) -> str:
    return f"{value}m"


def _bytes(value: int) -> str:
    for unit, scale in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value}B"
