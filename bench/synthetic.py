"""Synthetic Kubernetes objects (nodes, Knative pods) as `kubectl get -o json` prints them, and
invocation CloudEvents as an adapter sends them.

Used by the benchmarks, the tests and to write the bundled example snapshot:
`python -m bench.synthetic --nodes 12 --out examples/cluster`. The cluster is seeded and
heterogeneous: general, compute, memory and GPU pools (GPU nodes tainted), three zones,
some cordoned nodes, images cached per node as the kubelet reports them (at most 50).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

from cloudevents.core.bindings.http import HTTPMessage, to_binary_event
from cloudevents.core.v1.event import CloudEvent

Obj = dict[str, Any]
MiB = 1024 * 1024
QUEUE_PROXY = "gcr.io/knative-releases/knative.dev/serving/cmd/queue@sha256:" + "a" * 64
KUBELET_MAX_IMAGES = 50  # nodeStatusMaxImages default

# (pool, share of nodes, cpu, memory GiB, gpus)
POOLS = (
    ("general", 0.5, 4, 16, 0),
    ("compute", 0.2, 16, 64, 0),
    ("memory", 0.2, 8, 64, 0),
    ("gpu", 0.1, 8, 61, 1),
)
ZONES = ("zone-a", "zone-b", "zone-c")


def image_ref(i: int) -> str:
    return f"registry.example.com/functions/fn-{i:03d}@sha256:{i:064x}"


def node(
    name: str,
    *,
    cpu: str = "4",
    memory: str = "16Gi",
    pods: str = "110",
    gpus: int = 0,
    labels: dict[str, str] | None = None,
    taints: list[Obj] | None = None,
    images: list[tuple[list[str], int]] | None = None,
    unschedulable: bool = False,
) -> Obj:
    allocatable = {"cpu": cpu, "memory": memory, "pods": pods}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    spec: Obj = {"taints": taints} if taints else {}
    if unschedulable:
        spec["unschedulable"] = True
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": spec,
        "status": {
            "allocatable": allocatable,
            "capacity": allocatable,
            "images": [{"names": names, "sizeBytes": size} for names, size in images or []],
        },
    }


def knative_pod(
    name: str,
    *,
    service: str,
    namespace: str = "default",
    image: str = "registry.example.com/functions/hello:1.0",
    cpu: str | None = "250m",
    memory: str | None = "256Mi",
    gpus: int = 0,
    node_name: str | None = None,
    priority: str | None = None,
    uid: str | None = None,
    tolerations: list[Obj] | None = None,
    node_selector: dict[str, str] | None = None,
) -> Obj:
    """A revision pod as Knative makes it: user container plus queue-proxy, Knative labels."""
    requests: Obj = {}
    if cpu is not None:
        requests["cpu"] = cpu
    if memory is not None:
        requests["memory"] = memory
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
    revision = f"{service}-00001"
    spec: Obj = {
        "schedulerName": "kdrl-scheduler",
        "containers": [
            {"name": "user-container", "image": image, "resources": {"requests": requests}},
            {
                "name": "queue-proxy",
                "image": QUEUE_PROXY,
                "resources": {"requests": {"cpu": "25m", "memory": "32Mi"}},
            },
        ],
    }
    if node_name:
        spec["nodeName"] = node_name
    if tolerations:
        spec["tolerations"] = tolerations
    if node_selector:
        spec["nodeSelector"] = node_selector
    annotations = {"kdrl.dev/priority": priority} if priority else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or f"uid-{namespace}-{name}",
            "labels": {
                "serving.knative.dev/service": service,
                "serving.knative.dev/configuration": service,
                "serving.knative.dev/revision": revision,
            },
            "annotations": annotations,
        },
        "spec": spec,
        "status": {"phase": "Running" if node_name else "Pending"},
    }


def pending_pod(i: int, *, uid_prefix: str = "pending") -> Obj:
    """The benchmarks' i-th pending pod: 120 functions' images, a spread of small requests."""
    return knative_pod(
        f"fn-{i}-pending",
        service=f"fn-{i % 120:03d}",
        image=image_ref(i % 120),
        cpu=f"{100 + 50 * (i % 8)}m",
        memory=f"{128 * (1 + i % 4)}Mi",
        uid=f"{uid_prefix}-{i}",
    )


def cluster(
    n_nodes: int, *, seed: int = 0, n_images: int = 120, load: float = 0.4
) -> tuple[list[Obj], list[Obj]]:
    """`n_nodes` heterogeneous nodes and Knative pods filling them to about `load` of CPU."""
    rng = random.Random(seed)
    sizes = [int(rng.lognormvariate(5.5, 0.8) * MiB) for _ in range(n_images)]  # median ~245 MiB
    nodes: list[Obj] = []
    pods: list[Obj] = []
    for i in range(n_nodes):
        pool, _, cpu, mem, gpus = rng.choices(POOLS, weights=[p[1] for p in POOLS])[0]
        cached = rng.sample(range(n_images), k=min(n_images, rng.randint(5, KUBELET_MAX_IMAGES - 1)))
        images = [([QUEUE_PROXY], 30 * MiB)] + [([image_ref(j)], sizes[j]) for j in cached]
        name = f"node-{i:05d}"
        nodes.append(
            node(
                name,
                cpu=str(cpu),
                memory=f"{mem}Gi",
                gpus=gpus,
                labels={"kdrl.dev/pool": pool, "topology.kubernetes.io/zone": ZONES[i % len(ZONES)]},
                taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
                if gpus
                else None,
                images=images,
                unschedulable=rng.random() < 0.02,
            )
        )
        used = 0.0
        while used < load * cpu * 1000:
            millis = rng.choice((100, 250, 500, 1000))
            fn = rng.randrange(n_images)
            pods.append(
                knative_pod(
                    f"fn-{fn:03d}-{i}-{len(pods)}",
                    service=f"fn-{fn:03d}",
                    image=image_ref(fn),
                    cpu=f"{millis}m",
                    memory=f"{millis}Mi",
                    node_name=name,
                )
            )
            used += millis + 25
    return nodes, pods


def invocation(event_id: str, function: str, start: str, *, source: str = "/bench") -> HTTPMessage:
    """A binary-mode `dev.kdrl.invocations.v1` event: one invocation of `function` in the
    minute from `start` (RFC 3339)."""
    attributes = {
        "type": "dev.kdrl.invocations.v1",
        "source": source,
        "id": event_id,
        "datacontenttype": "application/json",
    }
    data = {"function": function, "start": start, "seconds": 60, "count": 1}
    return to_binary_event(CloudEvent(attributes=attributes, data=data))


def as_list(kind: str, items: list[Obj]) -> Obj:
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    nodes, pods = cluster(args.nodes, seed=args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nodes.json").write_text(json.dumps(as_list("Node", nodes), indent=1) + "\n")
    (args.out / "pods.json").write_text(json.dumps(as_list("Pod", pods), indent=1) + "\n")
    pending = knative_pod(
        "hello-00001-deployment-7c9f8-abcde", service="hello", image=image_ref(7), priority="high"
    )
    (args.out / "pending-pod.json").write_text(json.dumps(pending, indent=1) + "\n")


if __name__ == "__main__":
    main()
