"""The one feasibility filter, shared by the extender, `kdrl score` and the simulator.

It mirrors the kube-scheduler Filter plugins a function pod meets: NodeUnschedulable,
TaintToleration, NodeAffinity (nodeSelector and required terms) and NodeResourcesFit (CPU,
memory, `nvidia.com/gpu`, pod count). It does not model volumes, ports, topology spread or
inter-pod affinity: the scheduler's in-tree filters ran before the extender is called.

Resource checks are vectorised; label and taint checks visit only the nodes that need them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from policies.types import BoolArray, IntArray, NodeTable, ObjectArray, PodRequest, Taint, Toleration

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
    reasons: Mapping[int, str]  # row -> why it cannot run the pod; feasible rows absent
    rejections: Mapping[str, int] = field(default_factory=dict)  # reason code -> nodes failing it

    def reason(self, row: int) -> str:
        return self.reasons.get(row, "")

    def failed(self, names: ObjectArray) -> tuple[dict[str, str], dict[str, str]]:
        """(resolvable, unresolvable) failures as node name -> reason."""
        resolvable: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        for row, reason in self.reasons.items():
            (unresolvable if self.unresolvable[row] else resolvable)[names[row]] = reason
        return resolvable, unresolvable


@dataclass(frozen=True, slots=True)
class _Check:
    code: str  # a short fixed name for metrics: cordoned, taint, node_affinity, pods, cpu, ...
    failing: BoolArray
    reason: Callable[[int], str]  # why row fails, computed only when asked for
    unresolvable: bool


def filter_nodes(pod: PodRequest, nodes: NodeTable, *, explain: bool = True) -> Verdicts:
    """Which nodes can run `pod`; with `explain`, a human-readable reason for each that cannot."""
    checks = [*_placement_checks(pod, nodes), *_resource_checks(pod, nodes)]
    failing = np.zeros(len(nodes), dtype=np.bool_)
    unresolvable = np.zeros(len(nodes), dtype=np.bool_)
    rejections: dict[str, int] = {}
    for check in checks:
        failing |= check.failing
        if check.unresolvable:
            unresolvable |= check.failing
        rejected = int(np.count_nonzero(check.failing))
        if rejected:
            rejections[check.code] = rejections.get(check.code, 0) + rejected
    reasons: dict[int, str] = {}
    if explain:
        for row in np.flatnonzero(failing).tolist():
            reasons[row] = "; ".join(c.reason(row) for c in checks if c.failing[row])
    return Verdicts(feasible=~failing, unresolvable=unresolvable, reasons=reasons, rejections=rejections)


def all_feasible(size: int) -> Verdicts:
    """The verdicts of `size` nodes known to pass (a filter answer being reused)."""
    return Verdicts(
        feasible=np.ones(size, dtype=np.bool_), unresolvable=np.zeros(size, dtype=np.bool_), reasons={}
    )


def _placement_checks(pod: PodRequest, nodes: NodeTable) -> list[_Check]:
    """Cordons, taints and labels: failures that evicting pods cannot fix."""
    checks = []
    if not _tolerated(UNSCHEDULABLE_TAINT, pod.tolerations):
        checks.append(
            _Check("cordoned", nodes.unschedulable, lambda row: "node is cordoned (spec.unschedulable)", True)
        )
    # Nodes of a pool share their taints: judge each distinct set once, then index.
    judged, failing = _judged(nodes.cluster.taint_sets, pod.tolerations)
    untolerated = failing[nodes.taint_set]
    checks.append(_Check("taint", untolerated, lambda row: judged[nodes.taint_set[row]], True))
    if pod.node_selector or pod.required_affinity:
        labels, names = nodes.labels, nodes.names
        mismatched = np.fromiter(
            (bool(_label_mismatch(pod, lab, name)) for lab, name in zip(labels, names)), np.bool_, len(nodes)
        )
        checks.append(
            _Check(
                "node_affinity", mismatched, lambda row: _label_mismatch(pod, labels[row], names[row]), True
            )
        )
    return checks


@functools.lru_cache(maxsize=256)  # a function's pods share tolerations; a cluster, its taint sets
def _judged(
    taint_sets: tuple[tuple[Taint, ...], ...], tolerations: tuple[Toleration, ...]
) -> tuple[tuple[str, ...], BoolArray]:
    judged = tuple(_untolerated(taints, tolerations) for taints in taint_sets)
    failing = np.array([bool(reason) for reason in judged], dtype=np.bool_)
    failing.setflags(write=False)
    return judged, failing


def _untolerated(taints: tuple[Taint, ...], tolerations: tuple[Toleration, ...]) -> str:
    return "; ".join(
        f"untolerated taint {_describe_taint(t)}"
        for t in taints
        if t.effect in _FILTERING_EFFECTS and not _tolerated(t, tolerations)
    )


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


def _resource_checks(pod: PodRequest, nodes: NodeTable) -> list[_Check]:
    """Pod count and requests (NodeResourcesFit): failures that preemption might fix."""
    count, capacity = nodes.pod_count, nodes.pods_allocatable
    checks = [
        _Check(
            "pods", count + 1 > capacity, lambda row: f"too many pods: {count[row]} of {capacity[row]}", False
        )
    ]
    for code, resource, wanted, requested, allocatable, show in (
        ("cpu", "cpu", pod.cpu_milli, nodes.cpu_requested, nodes.cpu_allocatable, _millicores),
        ("memory", "memory", pod.memory_bytes, nodes.memory_requested, nodes.memory_allocatable, _bytes),
        ("gpu", "nvidia.com/gpu", pod.gpu, nodes.gpu_requested, nodes.gpu_allocatable, str),
    ):
        if wanted > 0:  # NodeResourcesFit skips what the pod does not request
            checks.append(
                _Check(
                    code,
                    allocatable - requested < wanted,
                    _shortage(resource, wanted, requested, allocatable, show),
                    False,
                )
            )
    return checks


def _shortage(
    resource: str, wanted: int, requested: IntArray, allocatable: IntArray, show: Callable[[int], str]
) -> Callable[[int], str]:
    def reason(row: int) -> str:
        free = max(int(allocatable[row] - requested[row]), 0)
        return (
            f"insufficient {resource}: pod requests {show(wanted)}, node has {show(free)} free "
            f"of {show(int(allocatable[row]))}"
        )

    return reason


def _millicores(value: int) -> str:
    return f"{value}m"


def _bytes(value: int) -> str:
    for unit, scale in (("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)):
        if value >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value}B"
