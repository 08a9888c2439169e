"""Pre-pull pods: the pod itself, and running and sweeping them against the fake API server."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta

import pytest

from plugin.errors import KubeApiError
from plugin.prewarming import Prepuller
from prewarm import prepull
from tests.conftest import api_client, metric
from tests.fakekube import FakeKube

TARGET = prepull.Target(node="gpu-0001", image="gcr.io/distroless/python3@sha256:abc")


def test_the_pod_pulls_without_a_shell_on_the_chosen_node() -> None:
    pod = prepull.pod(TARGET, namespace="kdrl-system")
    spec = pod["spec"]
    assert spec["nodeName"] == "gpu-0001" and spec["restartPolicy"] == "Never"
    assert spec["tolerations"] == [{"operator": "Exists"}]  # the node was chosen: tolerate its taints
    (noop,) = spec["initContainers"]
    (pull,) = spec["containers"]
    assert pull["image"] == TARGET.image and pull["command"] == ["/kdrl/true"]
    assert noop["command"][-1] == "/kdrl/true"  # the static binary, copied in: no shell needed
    assert spec["activeDeadlineSeconds"] == prepull.DEADLINE_S
    assert pod["metadata"]["labels"][prepull.PREPULL_LABEL] == "true"
    assert prepull.pod_name(TARGET) == pod["metadata"]["name"] == prepull.pod_name(copy.copy(TARGET))
    assert prepull.pod_name(TARGET) != prepull.pod_name(prepull.Target("gpu-0002", TARGET.image))


def test_finished_and_confirmed() -> None:
    now = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
    assert prepull.outcome({"status": {"phase": "Succeeded"}}, now) == "succeeded"
    assert prepull.outcome({"status": {"phase": "Failed", "reason": "DeadlineExceeded"}}, now) == "timed_out"
    assert prepull.outcome({"status": {"phase": "Failed"}}, now) == "failed"

    def backing_off(minutes_ago: float, reason: str = "ImagePullBackOff") -> dict[str, object]:
        started = (now - timedelta(minutes=minutes_ago)).isoformat().replace("+00:00", "Z")
        waiting = [{"state": {"waiting": {"reason": reason}}}]
        return {"status": {"phase": "Pending", "startTime": started, "containerStatuses": waiting}}

    assert not prepull.finished(backing_off(2), now)  # the kubelet retries: give it time
    assert prepull.outcome(backing_off(prepull.DEADLINE_S / 60 + 1), now) == "timed_out"  # stuck
    assert prepull.outcome(backing_off(0, "InvalidImageName"), now) == "failed"  # can never pull
    assert not prepull.finished({"status": {"phase": "Pending"}}, now)
    node = {
        "status": {"images": [{"names": [TARGET.image, "gcr.io/distroless/python3:latest"], "sizeBytes": 1}]}
    }
    assert prepull.image_on_node(node, TARGET.image) and not prepull.image_on_node(node, "other:1")


async def test_run_and_sweep(fake_kube: tuple[FakeKube, str]) -> None:
    fake, url = fake_kube
    api = api_client(url)
    try:
        puller = Prepuller(api, namespace="kdrl-system", timeout_s=2.0, shadow=False)
        started, succeeded, timed_out = (
            metric("kdrl.prewarm.prepulls", kdrl_result=result)
            for result in ("started", "succeeded", "timed_out")
        )
        other = prepull.Target("node-b", "registry.example.com/app:2")
        first = await puller.ensure([TARGET, other])
        assert [a.patched for a in first] == [True, True]
        again = await puller.ensure([TARGET])
        assert again[0].reason == "already pulling"  # 409: the same (node, image) pod exists
        name = prepull.pod_name(TARGET)
        done = copy.deepcopy(fake.objects["pods"][f"kdrl-system/{name}"])
        done["status"] = {"phase": "Succeeded"}
        await fake.modify("pods", done)
        await fake.add(
            "pods",
            {"metadata": {"name": "unrelated", "namespace": "kdrl-system"}, "status": {"phase": "Succeeded"}},
        )
        assert await puller.sweep() == [name]
        assert set(fake.objects["pods"]) == {
            f"kdrl-system/{prepull.pod_name(other)}",
            "kdrl-system/unrelated",
        }
        assert metric("kdrl.prewarm.prepulls", kdrl_result="succeeded") == succeeded + 1

        stuck = copy.deepcopy(fake.objects["pods"][f"kdrl-system/{prepull.pod_name(other)}"])
        an_hour_ago = (datetime.now(UTC) - timedelta(hours=1)).isoformat().replace("+00:00", "Z")
        waiting = [{"state": {"waiting": {"reason": "ImagePullBackOff"}}}]
        stuck["status"] = {"phase": "Pending", "startTime": an_hour_ago, "containerStatuses": waiting}
        await fake.modify("pods", stuck)
        assert await puller.sweep() == [prepull.pod_name(other)]  # given up on, and counted
        assert metric("kdrl.prewarm.prepulls", kdrl_result="timed_out") == timed_out + 1
        assert metric("kdrl.prewarm.prepulls", kdrl_result="started") == started + 2
    finally:
        await api.close()


async def test_shadow_and_outage(fake_kube: tuple[FakeKube, str]) -> None:
    fake, url = fake_kube
    api = api_client(url)
    try:
        shadow = Prepuller(api, namespace="kdrl-system", timeout_s=2.0, shadow=True)
        assert (await shadow.ensure([TARGET]))[0].patched is False
        assert not fake.objects["pods"]
        fake.outage = True
        with pytest.raises(KubeApiError):
            await Prepuller(api, namespace="kdrl-system", timeout_s=2.0, shadow=False).ensure([TARGET])
    finally:
        await api.close()
