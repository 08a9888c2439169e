"""Feature encoding and node economics: the numbers the learned policy sees."""

from __future__ import annotations

import numpy as np

from policies import economics, features
from policies.types import Node, NodeTable, PodRequest, Priority

MiB = 1 << 20
IMAGE = "registry.example.com/shop/cart@sha256:1"


def node(
    name: str, price: str, *, spot: bool = False, image: bool = False, pods: int = 0, **more: object
) -> Node:
    labels = {
        **economics.node_labels(float(price), 100.0, 300.0, 50.0, spot=spot),
        "topology.kubernetes.io/zone": "zone-a" if name != "c" else "zone-b",
    }
    return Node(
        name=name,
        cpu_allocatable=8000,
        memory_allocatable=32 << 30,
        cpu_requested=2000,
        memory_requested=4 << 30,
        pod_count=pods,
        labels=labels,
        images={IMAGE: 200 * MiB} if image else {},
        function_pods={"shop/cart": pods} if pods else {},
        **more,  # type: ignore[arg-type]
    )


POD = PodRequest(
    namespace="shop",
    name="cart-1",
    function="shop/cart",
    priority=Priority.HIGH,
    cpu_milli=1000,
    memory_bytes=1 << 30,
    images=(IMAGE,),
)


def column(observation: features.Observation, name: str) -> list[float]:
    return observation.nodes[:, features.NODE_FEATURES.index(name)].astype(np.float64).round(4).tolist()


def test_encoding_reads_the_table() -> None:
    table = NodeTable.from_nodes(
        [node("a", "0.4", image=True, pods=2), node("b", "0.2", spot=True), node("c", "0.6")]
    )
    observation = features.encode(POD, table)
    assert observation.nodes.shape == (3, len(features.NODE_FEATURES))
    assert observation.nodes.dtype == np.float32
    assert column(observation, "image_present") == [1.0, 0.0, 0.0]
    assert column(observation, "pull_s_log") == [
        0.0,
        round(float(np.log1p(4.0)), 4),
        round(float(np.log1p(4.0)), 4),
    ]
    assert column(observation, "price_rel") == [1.0, 0.5, 1.5]
    assert column(observation, "spot") == [0.0, 1.0, 0.0]
    assert column(observation, "zone_function_share") == [1.0, 1.0, 0.0]
    assert column(observation, "cpu_free_after") == [0.625, 0.625, 0.625]
    pod = dict(zip(features.POD_FEATURES, observation.pod.tolist()))
    assert pod["priority_high"] == 1.0 and pod["priority_normal"] == 0.0


def test_context_is_taken_over_the_candidates() -> None:
    table = NodeTable.from_nodes([node("a", "0.4"), node("b", "0.2"), node("c", "0.6")])
    only_two = features.encode(POD, table, candidates=np.array([True, True, False]))
    assert column(only_two, "price_rel") == [round(0.4 / 0.3, 4), round(0.2 / 0.3, 4), 2.0]
    # the same two nodes passed alone give the same rows: training and serving agree
    alone = features.encode(POD, table.take([0, 1]))
    np.testing.assert_allclose(alone.nodes, only_two.nodes[:2])
    np.testing.assert_allclose(alone.cluster, only_two.cluster)


def test_schema_hash_is_stable_and_names_are_unique() -> None:
    assert len(features.SCHEMA_HASH) == 16
    for names in (features.NODE_FEATURES, features.POD_FEATURES, features.CLUSTER_FEATURES):
        assert len(set(names)) == len(names)


def test_economics_from_labels_with_bad_values() -> None:
    labels = [
        {economics.PRICE_LABEL: "0.38", "cloud.google.com/gke-spot": "true", economics.ZONE_LABEL: "z1"},
        {economics.PRICE_LABEL: "cheap", economics.IDLE_WATTS_LABEL: "-5", economics.MAX_WATTS_LABEL: "1e99"},
        {economics.IDLE_WATTS_LABEL: "400"},  # above the default maximum: max follows idle
    ]
    found = economics.NodeEconomics.from_labels(labels)
    assert found.price_per_hour.tolist() == [0.38, economics.DEFAULT_PRICE, economics.DEFAULT_PRICE]
    assert found.spot.tolist() == [True, False, False]
    assert found.idle_watts.tolist() == [100.0, 100.0, 400.0]
    assert found.max_watts.tolist() == [250.0, 250.0, 400.0]
    assert found.zones == ("z1", "") and found.zone.tolist() == [0, 1, 1]


def test_encoding_some_rows_keeps_the_candidates_context() -> None:
    """A model that scores a shortlist sees exactly those rows of the whole encoding: relative
    and cluster features still over every candidate, the image's size from every row."""
    table = NodeTable.from_nodes(
        [
            node("a", "0.4", image=True, pods=2),
            node("b", "0.2", spot=True),
            node("c", "0.6"),
            node("d", "0.8"),
        ]
    )
    candidates = np.array([True, True, False, True])
    whole = features.encode(POD, table, candidates)
    rows = np.array([3, 1])  # the order given, not the table's
    some = features.encode(POD, table, candidates, rows=rows)
    np.testing.assert_array_equal(some.nodes, whole.nodes[rows])
    np.testing.assert_array_equal(some.cluster, whole.cluster)
    np.testing.assert_array_equal(some.pod, whole.pod)
    assert column(some, "pull_s_log")[0] == round(float(np.log1p(4.0)), 4)  # the image's size from row a
