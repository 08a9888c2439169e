"""kube-scheduler's scoring formulas, table-driven, with the arithmetic written out per case."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from policies import heuristics, placement
from policies.types import Node, NodeTable, PodRequest

GiB, MiB = 1 << 30, 1 << 20
NODE = Node(name="n", cpu_allocatable=4000, memory_allocatable=16 * GiB)
POD = PodRequest(
    namespace="ns",
    name="p",
    cpu_milli=1000,
    memory_bytes=4 * GiB,
    cpu_milli_nonzero=1000,
    memory_bytes_nonzero=4 * GiB,
)


def score(fn: heuristics.TermFunction, pod: PodRequest, *nodes: Node) -> list[int]:
    return [int(v) for v in fn(pod, NodeTable.from_nodes(list(nodes)))]


def node(**changes: Any) -> Node:
    return dataclasses.replace(NODE, **changes)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        # cpu (4000-2000)*100/4000 = 50, memory (16-8)*100/16 = 50 -> 50
        ({"cpu_nonzero_requested": 1000, "memory_nonzero_requested": 4 * GiB}, 50),
        # cpu (4000-3000)*100/4000 = 25, memory (16-6)*100/16 = 62.5 -> 62; (25+62)/2 = 43
        ({"cpu_nonzero_requested": 2000, "memory_nonzero_requested": 2 * GiB}, 43),
        # cpu over capacity scores 0; memory (16-4)*100/16 = 75; (0+75)/2 = 37
        ({"cpu_nonzero_requested": 3500}, 37),
        # memory allocatable 0: resource skipped, cpu alone (4000-1000)*100/4000 = 75
        ({"memory_allocatable": 0}, 75),
    ],
)
def test_least_allocated(changes: dict[str, Any], expected: int) -> None:
    assert score(heuristics.least_allocated, POD, node(**changes)) == [expected]


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        # cpu 2000*100/4000 = 50, memory 6*100/16 = 37.5 -> 37; (50+37)/2 = 43
        ({"cpu_nonzero_requested": 1000, "memory_nonzero_requested": 2 * GiB}, 43),
        # over capacity is capped at 100: cpu 100, memory 4/16 -> 25; 62
        ({"cpu_nonzero_requested": 5000}, 62),
    ],
)
def test_most_allocated(changes: dict[str, Any], expected: int) -> None:
    assert score(heuristics.most_allocated, POD, node(**changes)) == [expected]


def test_balanced_allocation_rewards_the_node_the_pod_balances() -> None:
    pod = dataclasses.replace(POD, cpu_milli=1000, memory_bytes=0)
    # without: f = (1000/4000, 8/16) = (.25, .5), std .125 -> S 87; with: (.5, .5) -> S 100
    # 50 + (50 + 100 - 87) // 2 = 81
    lopsided = node(cpu_requested=1000, memory_requested=8 * GiB)
    # already balanced: (.25, .25) -> 100; with: (.5, .25) -> 87; 50 + (50 + 87 - 100) // 2 = 68
    balanced = node(cpu_requested=1000, memory_requested=4 * GiB)
    assert score(heuristics.balanced_allocation, pod, lopsided, balanced) == [81, 68]


def test_balanced_allocation_is_neutral_for_a_pod_without_requests() -> None:
    pod = dataclasses.replace(POD, cpu_milli=0, memory_bytes=0)
    assert score(heuristics.balanced_allocation, pod, node()) == [0]


def test_image_locality_scales_by_spread_and_container_count() -> None:
    app, proxy = "repo/app@sha256:1", "repo/proxy@sha256:2"
    pod = dataclasses.replace(POD, images=(app, proxy))
    with_app = node(name="a", images={app: 500 * MiB, proxy: 30 * MiB})
    also_app = node(name="b", images={app: 500 * MiB, proxy: 30 * MiB})
    proxy_only = [node(name=n, images={proxy: 30 * MiB}) for n in ("c", "d")]
    # with app: 500 MiB * 2/4 + 30 MiB * 4/4 = 280 MiB; ceiling 2 * 1000 MiB
    # 100 * (280 - 23) / (2000 - 23) = 12.99 -> 12; proxy only: 100 * (30 - 23) / 1977 -> 0
    assert score(heuristics.image_locality, pod, with_app, also_app, *proxy_only) == [12, 12, 0, 0]


def test_image_locality_spread_counts_the_whole_cluster_not_the_candidates() -> None:
    app = "repo/app:1"
    pod = dataclasses.replace(POD, images=(app,))
    table = NodeTable.from_nodes(
        [node(name="a", images={app: 1000 * MiB}), node(name="b"), node(name="c"), node(name="d")]
    )
    # 1000 MiB * 1/4 = 250 MiB; 100 * (250 - 23) / (1000 - 23) = 23.2 -> 23, also in a one-node subset
    assert int(heuristics.image_locality(pod, table.take([0]))[0]) == 23


def test_kube_default_sums_its_terms_with_weight_one() -> None:
    policy = heuristics.kube_default()
    table = NodeTable.from_nodes(
        [node(name="a"), node(name="b", cpu_nonzero_requested=2000, cpu_requested=2000)]
    )
    terms = policy.terms(POD, table)
    assert [t.name for t in terms] == ["NodeResourcesFit", "NodeResourcesBalancedAllocation", "ImageLocality"]
    np.testing.assert_array_equal(policy.score(POD, table), sum(t.values for t in terms))


def test_least_and_most_allocated_disagree_on_the_busier_node() -> None:
    table = NodeTable.from_nodes(
        [node(name="idle"), node(name="busy", cpu_nonzero_requested=2000, cpu_requested=2000)]
    )
    spread = heuristics.kube_default().score(POD, table)
    packed = heuristics.most_allocated_policy().score(POD, table)
    assert spread[0] > spread[1] and packed[1] > packed[0]


def test_by_name_rejects_unknown_policies() -> None:
    with pytest.raises(KeyError, match="known: kube-default"):
        heuristics.by_name("magic")


def test_policies_that_score_rows_alone_give_candidates_the_scores_of_the_whole_table() -> None:
    rng = np.random.default_rng(3)
    nodes = [
        node(
            name=f"n{i}",
            cpu_allocatable=int(rng.choice([0, 2000, 8000])),
            cpu_requested=int(rng.integers(0, 9000)),
            cpu_nonzero_requested=int(rng.integers(0, 9000)),
            memory_requested=int(rng.integers(0, 20)) * GiB,
            memory_nonzero_requested=int(rng.integers(0, 20)) * GiB,
            images={"app": 300 * MiB} if rng.random() < 0.4 else {},
        )
        for i in range(40)
    ]
    table = NodeTable.from_nodes(nodes)
    pod = dataclasses.replace(POD, images=("app",))
    rows = np.flatnonzero(rng.random(len(nodes)) < 0.6)
    for name in ("kube-default", "most-allocated", "tuned"):
        policy = heuristics.by_name(name)
        assert placement.scores_rows_alone(policy)
        np.testing.assert_array_equal(policy.score(pod, table)[rows], policy.score(pod, table.take(rows)))
    # Normalised over the candidates, or drawn per call: the whole table would change them.
    for policy in (heuristics.weighted("cheap", {"Cheapness": 1.0}), heuristics.RandomPolicy()):
        assert not placement.scores_rows_alone(policy)
