"""The contract every placement policy keeps: one finite score per node, deterministic, pure."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from bench import synthetic
from plugin import convert
from plugin.cluster import ClusterCache
from policies import registry
from policies.placement import PlacementPolicy
from policies.types import NodeTable, PodRequest


def _load(name: str) -> PlacementPolicy:
    loaded = registry.load(name, seed=7, device="cpu")
    assert not loaded.degraded, loaded.degraded  # the shipped model must load
    return loaded.policy


POLICY_FACTORIES: dict[str, Callable[[], PlacementPolicy]] = {
    name: (lambda name=name: _load(name)) for name in registry.PLACEMENT_NAMES
}


@pytest.fixture(scope="module")
def table() -> NodeTable:
    nodes, pods = synthetic.cluster(60, seed=3)
    return ClusterCache.from_objects(nodes, pods).snapshot.nodes


@pytest.fixture(scope="module")
def pod() -> PodRequest:
    return convert.pod_request(synthetic.knative_pod("p", service="s", image=synthetic.image_ref(4)))


@pytest.fixture(params=sorted(POLICY_FACTORIES))
def policy(request: pytest.FixtureRequest) -> PlacementPolicy:
    return POLICY_FACTORIES[request.param]()


def test_is_a_placement_policy(policy: PlacementPolicy) -> None:
    assert isinstance(policy, PlacementPolicy)
    assert policy.name in registry.PLACEMENT_NAMES


def test_one_finite_score_per_node(policy: PlacementPolicy, pod: PodRequest, table: NodeTable) -> None:
    scores = policy.score(pod, table)
    assert scores.shape == (len(table),)
    assert np.isfinite(scores).all()


def test_deterministic(policy: PlacementPolicy, pod: PodRequest, table: NodeTable) -> None:
    np.testing.assert_array_equal(policy.score(pod, table), policy.score(pod, table))


def test_inputs_untouched(policy: PlacementPolicy, pod: PodRequest, table: NodeTable) -> None:
    before = copy.deepcopy(table)
    policy.score(pod, table)
    for column in ("cpu_requested", "memory_requested", "pod_count", "cpu_allocatable"):
        np.testing.assert_array_equal(getattr(table, column), getattr(before, column))
    assert list(table.images) == list(before.images) and list(table.labels) == list(before.labels)


def test_empty_table(policy: PlacementPolicy, pod: PodRequest) -> None:
    assert policy.score(pod, NodeTable.empty()).shape == (0,)


def test_one_node(policy: PlacementPolicy, pod: PodRequest, table: NodeTable) -> None:
    assert policy.score(pod, table.take([0])).shape == (1,)


def test_scores_do_not_depend_on_other_candidates_order(
    policy: PlacementPolicy, pod: PodRequest, table: NodeTable
) -> None:
    if policy.name == "random":
        pytest.skip("random scores follow row order by design")
    reversed_rows = np.arange(len(table))[::-1]
    # float32 inference may sum the pooled context in another order: equal to rounding
    np.testing.assert_allclose(
        policy.score(pod, table.take(reversed_rows)), policy.score(pod, table)[::-1], rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("content", [None, "{not json", '{"weights": ["MostAllocated"]}'])
def test_unreadable_tuned_weights_fall_back_to_kube_default(tmp_path: Path, content: str | None) -> None:
    weights = tmp_path / "tuned.json"
    if content is not None:
        weights.write_text(content)
    loaded = registry.load("tuned", tuned_weights=weights)
    assert loaded.policy.name == "kube-default" and loaded.provider == "none"
    assert "tuned.json" in loaded.degraded
