"""The shared feasibility filter, table-driven: one node, one pod, the verdict and its reason."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from policies import filtering
from policies.types import LabelRequirement, Node, NodeSelectorTerm, NodeTable, PodRequest, Taint, Toleration

GiB = 1 << 30
BASE = Node(name="n", cpu_allocatable=4000, memory_allocatable=16 * GiB, pods_allocatable=10)
POD = PodRequest(namespace="ns", name="p", cpu_milli=1000, memory_bytes=GiB)
GPU_TAINT = Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")


def node(**changes: Any) -> Node:
    return dataclasses.replace(BASE, **changes)


def pod(**changes: Any) -> PodRequest:
    return dataclasses.replace(POD, **changes)


ZONE_A = NodeSelectorTerm(requirements=(LabelRequirement(key="zone", operator="In", values=("a",)),))

CASES = [
    ("fits", node(), POD, ""),
    (
        "cpu",
        node(cpu_requested=3500),
        POD,
        "insufficient cpu: pod requests 1000m, node has 500m free of 4000m",
    ),
    (
        "memory",
        node(memory_requested=16 * GiB),
        POD,
        "insufficient memory: pod requests 1.0Gi, node has 0B free",
    ),
    ("gpu", node(), pod(gpu=1), "insufficient nvidia.com/gpu: pod requests 1, node has 0 free of 0"),
    ("gpu fits", node(gpu_allocatable=2, gpu_requested=1), pod(gpu=1), ""),
    ("pod count", node(pod_count=10), POD, "too many pods: 10 of 10"),
    ("zero request fits a full node", node(cpu_requested=4000), pod(cpu_milli=0), ""),
    ("taint", node(taints=(GPU_TAINT,)), POD, "untolerated taint nvidia.com/gpu=present:NoSchedule"),
    (
        "taint tolerated",
        node(taints=(GPU_TAINT,)),
        pod(tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists"),)),
        "",
    ),
    (
        "taint value must match",
        node(taints=(GPU_TAINT,)),
        pod(tolerations=(Toleration(key="nvidia.com/gpu", value="no"),)),
        "untolerated taint",
    ),
    ("wildcard toleration", node(taints=(GPU_TAINT,)), pod(tolerations=(Toleration(operator="Exists"),)), ""),
    ("PreferNoSchedule only scores", node(taints=(Taint(key="k", effect="PreferNoSchedule"),)), POD, ""),
    (
        "NoExecute filters",
        node(taints=(Taint(key="k", effect="NoExecute"),)),
        POD,
        "untolerated taint k:NoExecute",
    ),
    ("cordoned", node(unschedulable=True), POD, "node is cordoned"),
    (
        "cordon tolerated",
        node(unschedulable=True),
        pod(
            tolerations=(
                Toleration(key="node.kubernetes.io/unschedulable", operator="Exists", effect="NoSchedule"),
            )
        ),
        "",
    ),
    (
        "selector",
        node(labels={"disk": "hdd"}),
        pod(node_selector={"disk": "ssd"}),
        "nodeSelector disk=ssd does not match",
    ),
    ("selector ok", node(labels={"disk": "ssd"}), pod(node_selector={"disk": "ssd"}), ""),
    (
        "affinity",
        node(labels={"zone": "b"}),
        pod(required_affinity=(ZONE_A,)),
        "required node affinity does not match",
    ),
    ("affinity ok", node(labels={"zone": "a"}), pod(required_affinity=(ZONE_A,)), ""),
    (
        "reasons add up",
        node(unschedulable=True, pod_count=10),
        POD,
        "node is cordoned (spec.unschedulable); too many pods",
    ),
]


@pytest.mark.parametrize(("case", "the_node", "the_pod", "reason"), CASES, ids=[c[0] for c in CASES])
def test_filter(case: str, the_node: Node, the_pod: PodRequest, reason: str) -> None:
    verdicts = filtering.filter_nodes(the_pod, NodeTable.from_nodes([the_node]))
    assert bool(verdicts.feasible[0]) == (reason == "")
    assert verdicts.reason(0).startswith(reason)


def test_failures_split_by_whether_preemption_could_help() -> None:
    nodes = NodeTable.from_nodes(
        [node(name="ok"), node(name="busy", cpu_requested=4000), node(name="tainted", taints=(GPU_TAINT,))]
    )
    resolvable, unresolvable = filtering.filter_nodes(POD, nodes).failed(nodes.names)
    assert list(resolvable) == ["busy"]
    assert list(unresolvable) == ["tainted"]


def test_rejections_count_nodes_per_reason_code_for_the_metrics() -> None:
    nodes = NodeTable.from_nodes(
        [
            node(name="ok"),
            node(name="busy", cpu_requested=4000),
            node(name="tainted", taints=(GPU_TAINT,)),
            node(name="both", unschedulable=True, cpu_requested=4000),
        ]
    )
    verdicts = filtering.filter_nodes(POD, nodes, explain=False)  # counted even unexplained
    assert verdicts.rejections == {"cpu": 2, "taint": 1, "cordoned": 1}
    assert filtering.filter_nodes(POD, nodes.take([0])).rejections == {}


def test_empty_table() -> None:
    verdicts = filtering.filter_nodes(POD, NodeTable.empty())
    assert verdicts.feasible.shape == (0,)
