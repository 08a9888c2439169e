"""Pod and Node JSON into policy types: requests as kube-scheduler sums them, identity, errors."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from bench import synthetic
from plugin import convert
from plugin.errors import ObjectError
from policies.types import Priority, Taint, Toleration

MiB = 1024 * 1024


def pod_with(spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u", **meta}, "spec": spec}


def container(
    cpu: str | None = None, memory: str | None = None, image: str = "img:1", **extra: Any
) -> dict[str, Any]:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return {"name": "c", "image": image, "resources": {"requests": requests}, **extra}


def test_knative_pod_identity_and_priority() -> None:
    pod = convert.pod_request(
        synthetic.knative_pod("hello-abc", service="hello", namespace="shop", priority="critical")
    )
    assert pod.function == "shop/hello"
    assert pod.revision == "hello-00001"
    assert pod.priority is Priority.CRITICAL
    assert pod.key == "shop/hello-abc"


def test_requests_sum_containers_including_queue_proxy() -> None:
    pod = convert.pod_request(synthetic.knative_pod("p", service="s", cpu="250m", memory="256Mi"))
    assert (pod.cpu_milli, pod.memory_bytes) == (275, 288 * MiB)  # queue-proxy: 25m, 32Mi


def test_init_containers_count_by_max_and_sidecars_add() -> None:
    spec = {
        "initContainers": [
            container("2", "64Mi"),  # regular: runs alone
            container("100m", "10Mi", restartPolicy="Always"),  # sidecar: runs with everything after
            container("1", "1Gi"),  # regular, started with the sidecar running
        ],
        "containers": [container("500m", "128Mi")],
        "overhead": {"cpu": "10m", "memory": "1Mi"},
    }
    pod = convert.pod_request(pod_with(spec))
    # cpu: max(500 + 100, 2000, 100 + 1000) + 10; memory: max(128 + 10, 64, 10 + 1024) + 1
    assert pod.cpu_milli == 2010
    assert pod.memory_bytes == 1035 * MiB


def test_scoring_defaults_apply_only_to_missing_requests() -> None:
    spec = {"containers": [container(), container(cpu="0", memory="64Mi")]}
    pod = convert.pod_request(pod_with(spec))
    assert (pod.cpu_milli, pod.memory_bytes) == (0, 64 * MiB)
    assert pod.cpu_milli_nonzero == convert.DEFAULT_CPU_MILLI  # explicit 0 stays 0
    assert pod.memory_bytes_nonzero == convert.DEFAULT_MEMORY_BYTES + 64 * MiB


def test_pod_level_requests_replace_the_containers_sum() -> None:
    """The examples of "Assign Pod-level CPU and memory resources" (kubernetes.io) and KEP-2837."""
    both = {"requests": {"cpu": "1", "memory": "100Mi"}, "limits": {"cpu": "1", "memory": "200Mi"}}
    bare = convert.pod_request(pod_with({"resources": both, "containers": [container(), container()]}))
    assert (bare.cpu_milli, bare.memory_bytes) == (1000, 100 * MiB)  # containers that request nothing
    assert (bare.cpu_milli_nonzero, bare.memory_bytes_nonzero) == (1000, 100 * MiB)  # no scoring defaults
    some = {
        "resources": both,
        "containers": [container("500m", "50Mi"), container()],
        "overhead": {"cpu": "10m"},
    }
    pod = convert.pod_request(pod_with(some))
    assert (pod.cpu_milli, pod.memory_bytes) == (1010, 100 * MiB)  # pod level, plus the overhead
    limits_only = {"resources": {"limits": {"memory": "1Gi"}}, "containers": [container("2", "64Mi")]}
    defaulted = convert.pod_request(pod_with(limits_only))
    assert (defaulted.cpu_milli, defaulted.memory_bytes) == (2000, 1024 * MiB)  # memory request = limit
    gpus = {"resources": {"requests": {"cpu": "1"}}, "containers": [container()]}
    gpus["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "1"
    assert convert.pod_request(pod_with(gpus)).gpu == 1  # not a pod-level resource: the containers'


def test_limits_stand_in_for_missing_requests() -> None:
    spec = {
        "containers": [
            {"name": "c", "image": "i", "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": "1"}}}
        ]
    }
    pod = convert.pod_request(pod_with(spec))
    assert (pod.cpu_milli, pod.gpu) == (1000, 1)


@pytest.mark.parametrize(
    ("reference", "normalized"),
    [
        ("nginx", "nginx:latest"),
        ("nginx:1.27", "nginx:1.27"),
        ("registry:5000/team/app", "registry:5000/team/app:latest"),
        ("repo/app@sha256:abc", "repo/app@sha256:abc"),
    ],
)
def test_image_names_normalized_like_kube_scheduler(reference: str, normalized: str) -> None:
    assert convert.normalize_image(reference) == normalized


def test_images_include_init_containers() -> None:
    spec = {"initContainers": [container(image="init")], "containers": [container(image="app:2")]}
    assert convert.pod_request(pod_with(spec)).images == ("init:latest", "app:2")


def test_unknown_priority_warns_and_is_normal(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        pod = convert.pod_request(pod_with({"containers": []}, annotations={"kdrl.dev/priority": "urgent"}))
    assert pod.priority is Priority.NORMAL
    assert "urgent" in caplog.text


def test_non_knative_pod_has_no_function() -> None:
    assert convert.pod_request(pod_with({"containers": [container()]})).function is None


def test_scheduling_constraints() -> None:
    spec = {
        "containers": [container()],
        "nodeSelector": {"disk": "ssd"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]},
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
                    ]
                }
            }
        },
    }
    pod = convert.pod_request(pod_with(spec))
    assert pod.node_selector == {"disk": "ssd"}
    assert pod.tolerations == (Toleration(key="gpu", operator="Exists", effect="NoSchedule"),)
    first, second = pod.required_affinity
    assert first.matches({"zone": "b"}, "x") and not first.matches({"zone": "c"}, "x")
    assert second.matches({}, "n1") and not second.matches({}, "n2")


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ({"containers": "nope"}, "pod.spec.containers"),
        ({"containers": [container(cpu="lots")]}, "pod.spec.containers[0].resources.requests.cpu"),
        ({"containers": [container(cpu="-1")]}, "pod.spec.containers[0].resources.requests.cpu"),
        ({"containers": [container(memory="1e30")]}, "pod.spec.containers[0].resources.requests.memory"),
        ({"containers": [container(cpu="999999999")]}, "pod.spec.containers[0].resources.requests.cpu"),
        ({"containers": [container("600000", None)] * 2}, "pod.spec"),
        ({"containers": [{"image": 3}]}, "pod.spec.containers[0].image"),
        ({"containers": [], "tolerations": ["x"]}, "pod.spec.tolerations[0]"),
        ({"containers": [], "nodeSelector": {"a": 1}}, "pod.spec.nodeSelector"),
    ],
)
def test_bad_pods_name_the_field(spec: dict[str, Any], path: str) -> None:
    with pytest.raises(ObjectError) as caught:
        convert.pod_request(pod_with(spec))
    assert caught.value.path == path


def test_node_row() -> None:
    node = convert.node_row(
        synthetic.node(
            "n1",
            cpu="3500m",
            memory="15Gi",
            gpus=2,
            labels={"zone": "a"},
            taints=[{"key": "k", "value": "v", "effect": "NoExecute"}],
            images=[(["repo/a:1", "repo/a@sha256:1"], 5 * MiB)],
            unschedulable=True,
        )
    )
    assert (node.cpu_allocatable, node.memory_allocatable, node.gpu_allocatable) == (3500, 15 * 1024 * MiB, 2)
    assert node.labels["zone"] == "a" and node.unschedulable
    assert node.taints == (Taint(key="k", value="v", effect="NoExecute"),)
    assert node.images == {"repo/a:1": 5 * MiB, "repo/a@sha256:1": 5 * MiB}


def test_bad_node_names_the_field() -> None:
    with pytest.raises(ObjectError, match=r"node\.status\.allocatable\.memory"):
        convert.node_row({"metadata": {"name": "n"}, "status": {"allocatable": {"memory": "many"}}})
