"""Warm replicas through the real client against the fake API server (Knative Serving paths)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from plugin import cleanup, cli
from plugin.errors import KubeApiError
from plugin.functions import routed_revisions
from plugin.prewarming import RevisionActuator
from prewarm import actuation as act
from prewarm import prepull
from tests.conftest import api_client
from tests.fakekube import FakeKube

UNTIL = datetime(2026, 12, 2, 18, 10, tzinfo=UTC)
NOW = UNTIL - timedelta(minutes=10)


def service(name: str, traffic: list[tuple[str, int]]) -> dict[str, Any]:
    return {
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": "shop"},
        "status": {"traffic": [{"revisionName": r, "percent": p} for r, p in traffic]},
    }


def revision(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Revision",
        "metadata": {"name": name, "namespace": "shop", "annotations": annotations or {}},
    }


@pytest.fixture
async def cluster(fake_kube: tuple[FakeKube, str]) -> AsyncIterator[tuple[FakeKube, RevisionActuator]]:
    fake, url = fake_kube
    await fake.add(
        "services", service("hello", [("hello-00002", 90), ("hello-00003", 10), ("hello-00001", 0)])
    )
    for name in ("hello-00001", "hello-00002", "hello-00003"):
        await fake.add("revisions", revision(name, {act.MIN_SCALE: "1"} if name == "hello-00002" else {}))
    api = api_client(url)
    yield fake, RevisionActuator(api, timeout_s=2.0, shadow=False)
    await api.close()


def annotations(fake: FakeKube, name: str) -> dict[str, str]:
    return dict(fake.objects["revisions"][f"shop/{name}"]["metadata"].get("annotations") or {})


def test_routed_revisions_are_those_with_traffic() -> None:
    assert routed_revisions(service("s", [("a", 50), ("b", 50), ("c", 0)])) == ["a", "b"]
    assert routed_revisions({"status": {}}) == []


async def test_warm_patches_only_routed_revisions_and_restore_undoes_it(
    cluster: tuple[FakeKube, RevisionActuator],
) -> None:
    fake, actuator = cluster
    before = {name: annotations(fake, name) for name in ("hello-00001", "hello-00002", "hello-00003")}
    applied = await actuator.warm("shop/hello", 2, UNTIL, NOW)
    assert [a.revision for a in applied] == ["shop/hello-00002", "shop/hello-00003"]
    assert all(a.patched for a in applied)
    assert annotations(fake, "hello-00002")[act.MIN_SCALE] == "2"
    assert annotations(fake, "hello-00002")[act.ORIGINAL] == "1"
    assert annotations(fake, "hello-00001") == before["hello-00001"]  # no traffic: untouched
    events = sorted(fake.objects["events"].values(), key=lambda e: e["involvedObject"]["name"])
    assert [(e["involvedObject"]["name"], e["reason"]) for e in events] == [
        ("hello-00002", "Prewarmed"),
        ("hello-00003", "Prewarmed"),
    ]
    assert all(r.startswith(("GET", "PATCH")) or "/events" in r for r in fake.requests)

    await actuator.restore("shop/hello")
    assert {name: annotations(fake, name) for name in before} == before


async def test_shadow_mode_changes_nothing(cluster: tuple[FakeKube, RevisionActuator]) -> None:
    fake, actuator = cluster
    actuator.shadow = True
    applied = await actuator.warm("shop/hello", 3, UNTIL, NOW)
    assert [a.patched for a in applied] == [False, False]
    assert "min-scale 3" in applied[0].reason
    assert fake.patches == []


async def test_a_human_edit_between_read_and_write_is_respected(
    cluster: tuple[FakeKube, RevisionActuator],
) -> None:
    fake, actuator = cluster
    await actuator.warm("shop/hello", 2, UNTIL, NOW)
    edited = revision("hello-00003", {**annotations(fake, "hello-00003"), act.MIN_SCALE: "7"})
    await fake.modify("revisions", edited)
    applied = await actuator.warm("shop/hello", 4, UNTIL + timedelta(minutes=5), NOW)
    assert applied[1].patched is False and "edited by someone else" in applied[1].reason
    assert annotations(fake, "hello-00003")[act.MIN_SCALE] == "7"


async def test_a_conflicting_write_is_decided_again(cluster: tuple[FakeKube, RevisionActuator]) -> None:
    fake, actuator = cluster
    fake.interfere["shop/hello-00003"] = revision("hello-00003", {"team": "a"})  # lands first
    applied = await actuator.warm("shop/hello", 2, UNTIL, NOW)
    assert applied[1].patched
    assert sum(key == "shop/hello-00003" for key, _ in fake.patches) == 1  # the 409, then one patch
    assert [r for r in fake.requests if "hello-00003" in r].count(
        "PATCH /apis/serving.knative.dev/v1/namespaces/shop/revisions/hello-00003"
    ) == 2
    kept = annotations(fake, "hello-00003")
    assert kept["team"] == "a" and kept[act.MIN_SCALE] == "2"  # the other write survives


async def test_deleted_revision_and_missing_service(cluster: tuple[FakeKube, RevisionActuator]) -> None:
    fake, actuator = cluster
    await fake.delete("revisions", "shop/hello-00003")
    applied = await actuator.warm("shop/hello", 2, UNTIL, NOW)
    assert applied[1].reason == "revision not found" and not applied[1].patched
    assert await actuator.warm("shop/absent", 2, UNTIL, NOW) == []


async def test_an_outage_is_a_clear_error(cluster: tuple[FakeKube, RevisionActuator]) -> None:
    fake, actuator = cluster
    fake.outage = True
    with pytest.raises(KubeApiError) as caught:
        await actuator.warm("shop/hello", 2, UNTIL, NOW)
    assert caught.value.status == 503


async def test_cleanup_restores_from_the_revisions_alone(
    cluster: tuple[FakeKube, RevisionActuator], fake_kube: tuple[FakeKube, str]
) -> None:
    fake, actuator = cluster
    before = {name: annotations(fake, name) for name in ("hello-00001", "hello-00002", "hello-00003")}
    await actuator.warm("shop/hello", 3, UNTIL, NOW)
    held = revision("hello-00003", {**annotations(fake, "hello-00003"), act.MIN_SCALE: "9"})
    await fake.modify("revisions", held)  # a human took this one over
    api = api_client(fake_kube[1])  # a fresh client: nothing of the plugin's state
    try:
        report = await cleanup.cleanup(api, timeout_s=2.0)
    finally:
        await api.close()
    assert report.restored == ["shop/hello-00002"]
    assert report.left == [
        "shop/hello-00003: min-scale edited by someone else since the plugin set it: leaving it"
    ]
    assert annotations(fake, "hello-00002") == before["hello-00002"]


@pytest.mark.parametrize(
    ("labels", "allowed"),
    [
        ({"app.kubernetes.io/version": "1.21.0"}, True),
        ({"app.kubernetes.io/version": "v1.22.1"}, True),
        ({"app.kubernetes.io/version": "1.20.3"}, False),
        ({"serving.knative.dev/release": "v1.9.0"}, False),
        ({}, False),
    ],
)
async def test_serving_version_gate(
    fake_kube: tuple[FakeKube, str], labels: dict[str, str], allowed: bool
) -> None:
    fake, url = fake_kube
    controller = {"metadata": {"name": "controller", "namespace": "knative-serving", "labels": labels}}
    await fake.add("deployments", controller)
    api = api_client(url)
    try:
        ok, why = await cleanup.serving_supports_revision_min_scale(api, timeout_s=2.0)
    finally:
        await api.close()
    assert ok is allowed and ("shadow mode" in why) is not allowed


async def test_serving_version_unknown_when_not_installed(fake_kube: tuple[FakeKube, str]) -> None:
    api = api_client(fake_kube[1])
    try:
        ok, why = await cleanup.serving_supports_revision_min_scale(api, timeout_s=2.0)
    finally:
        await api.close()
    assert not ok and "unknown" in why


async def test_cleanup_command(
    cluster: tuple[FakeKube, RevisionActuator],
    fake_kube: tuple[FakeKube, str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake, actuator = cluster
    await actuator.warm("shop/hello", 2, UNTIL, NOW)
    target = prepull.Target(node="node-a", image="registry.example.com/shop/hello:1")
    await fake.add("pods", prepull.pod(target, namespace="kdrl-system"))
    await fake.add("pods", {"metadata": {"name": "someone-else", "namespace": "kdrl-system"}})
    code = await asyncio.to_thread(cli.main, ["cleanup", "--kube-api-url", fake_kube[1]])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["restored"] == ["shop/hello-00002", "shop/hello-00003"]
    assert printed["deleted_pods"] == [f"kdrl-system/{prepull.pod_name(target)}"]
    assert list(fake.objects["pods"]) == ["kdrl-system/someone-else"]  # not ours: left alone
    assert act.APPLIED not in annotations(fake, "hello-00002")


def test_cleanup_without_any_connection_settings_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key in ("KDRL_KUBE_API_URL", "KDRL_KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBECONFIG"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config
    assert cli.main(["cleanup"]) == 2
    error = capsys.readouterr().err
    assert "no Kubernetes connection" in error and "KDRL_KUBE_API_URL" in error and "Traceback" not in error


async def test_cleanup_connects_with_the_services_environment(
    cluster: tuple[FakeKube, RevisionActuator],
    fake_kube: tuple[FakeKube, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _, actuator = cluster
    await actuator.warm("shop/hello", 2, UNTIL, NOW)
    monkeypatch.setenv("KDRL_KUBE_API_URL", fake_kube[1])
    assert await asyncio.to_thread(cli.main, ["cleanup"]) == 0
    assert json.loads(capsys.readouterr().out)["restored"] == ["shop/hello-00002", "shop/hello-00003"]
