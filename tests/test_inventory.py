"""The inventory's snapshot table: usage filled into the nodes' own table equals rebuilding every
row from scratch, through any sequence of node and pod events."""

from __future__ import annotations

import dataclasses
import random

import numpy as np

from bench import synthetic
from plugin.inventory import Inventory
from policies.types import ROW_COLUMNS, NodeTable


def rebuilt(inventory: Inventory) -> NodeTable:
    """Every row from scratch: the node with its usage replaced in (the reference)."""
    rows = []
    for name in sorted(inventory.nodes):
        node, usage = inventory.nodes[name], inventory.usage.get(name)
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


def test_the_snapshot_equals_a_full_rebuild_through_any_events() -> None:
    rng = random.Random(5)
    inventory = Inventory()
    pods: list[dict[str, object]] = []
    for step in range(400):
        action = rng.random()
        if action < 0.1:
            inventory.upsert_node(synthetic.node(f"node-{rng.randrange(12)}", cpu=str(rng.choice([2, 4, 8]))))
        elif action < 0.13:
            inventory.delete_node({"metadata": {"name": f"node-{rng.randrange(12)}"}})
        elif action < 0.7 or not pods:
            pod = synthetic.knative_pod(
                f"p{step}",
                service=f"fn-{rng.randrange(5)}",
                cpu=f"{rng.randrange(1, 9) * 100}m",
                uid=f"u{step}",
                node_name=f"node-{rng.randrange(14)}",  # some on nodes the inventory lacks
            )
            pods.append(pod)
            inventory.upsert_pod(pod)
        else:
            inventory.delete_pod(pods.pop(rng.randrange(len(pods))))
        if step % 7 == 0:
            fast, reference = inventory.table(), rebuilt(inventory)
            assert list(fast.names) == list(reference.names)
            for column in ROW_COLUMNS:
                np.testing.assert_array_equal(
                    getattr(fast, column), getattr(reference, column), err_msg=column
                )
            assert list(fast.function_pods) == list(reference.function_pods)
            assert list(fast.images) == list(reference.images) and list(fast.labels) == list(reference.labels)
            for image in {i for row in reference.images for i in row}:
                np.testing.assert_array_equal(fast.image_sizes(image), reference.image_sizes(image))
