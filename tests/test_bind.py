"""Bind through the real client against the fake API server: 201, 409, 404, unreachable."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench import synthetic
from plugin import kube
from plugin.keys import CACHE
from tests.conftest import api_client
from tests.fakekube import FakeKube
from tests.test_cluster_cache import eventually, ready, seed, watching_client

Client = TestClient[web.Request, web.Application]


def binding(name: str, node: str, uid: str | None = None) -> dict[str, str]:
    return {"PodName": name, "PodNamespace": "default", "PodUID": uid or f"uid-default-{name}", "Node": node}


async def test_bind_creates_a_binding_and_a_second_one_conflicts(
    aiohttp_client: Any, fake_kube: tuple[FakeKube, str], spans: InMemorySpanExporter
) -> None:
    fake, url = fake_kube
    await seed(fake)
    client = await watching_client(aiohttp_client, url)
    await eventually(lambda: ready(client))
    pod = synthetic.knative_pod("pending", service="s", cpu="1")
    await client.post("/scheduler/filter", json={"Pod": pod, "NodeNames": ["a", "b"]})

    response = await client.post("/scheduler/bind", json=binding("pending", "b"))
    assert (response.status, await response.json()) == (200, {"Error": ""})
    (body,) = fake.bindings
    assert body["metadata"] == {"name": "pending", "namespace": "default", "uid": "uid-default-pending"}
    assert body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "b"}
    # assumed at once, before the watch confirms it
    await eventually(lambda: asyncio.sleep(0, int(client.app[CACHE].snapshot.nodes.pod_count[1]) == 1))

    again = await (await client.post("/scheduler/bind", json=binding("pending", "a"))).json()
    assert "already bound" in again["Error"] and "409" in again["Error"]
    bind_spans = [s for s in spans.get_finished_spans() if s.name == "kdrl.extender.bind"]
    assert [dict(s.attributes or {})["k8s.node.name"] for s in bind_spans] == ["b", "a"]
    assert bind_spans[1].status.status_code.name == "ERROR"


async def test_bind_of_a_missing_pod_is_an_error_not_a_crash(
    aiohttp_client: Any, fake_kube: tuple[FakeKube, str]
) -> None:
    _, url = fake_kube
    client = await watching_client(aiohttp_client, url)
    result = await (await client.post("/scheduler/bind", json=binding("ghost", "a"))).json()
    assert 'pods "ghost" not found' in result["Error"]


async def test_bind_with_a_stale_uid_conflicts(fake_kube: tuple[FakeKube, str]) -> None:
    fake, url = fake_kube
    await fake.add("pods", synthetic.knative_pod("p", service="s", uid="new-uid"))
    api = api_client(url)
    try:
        await kube.bind_pod(api, namespace="default", name="p", uid="old-uid", node="a", timeout_s=2)
    except kube.KubeApiError as error:
        assert error.status == 409 and "Precondition" in str(error)
    else:
        raise AssertionError("expected a conflict")
    finally:
        await api.close()


async def test_bind_while_the_api_is_unreachable(aiohttp_client: Any) -> None:
    client = await watching_client(aiohttp_client, "http://127.0.0.1:9")  # discard port: refused
    response = await client.post("/scheduler/bind", json=binding("p", "a"))
    assert response.status == 200
    assert "failed" in (await response.json())["Error"]
    assert (await client.get("/healthz")).status == 200


async def test_only_the_plugins_pods_are_bound_and_only_where_the_filter_passes(
    aiohttp_client: Any, fake_kube: tuple[FakeKube, str]
) -> None:
    """The attack of issue 19: bind a default-scheduler pod in kube-system to a tainted
    control-plane node. Refused, and so are a node the pod does not fit and an unknown node."""
    fake, url = fake_kube
    await seed(fake)
    control_plane = synthetic.node(
        "cp-1",
        cpu="4",
        memory="8Gi",
        taints=[{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
    )
    await fake.add("nodes", control_plane)
    victim = synthetic.knative_pod("victim", service="s", namespace="kube-system", uid="v1")
    victim["spec"]["schedulerName"] = "default-scheduler"
    await fake.add("pods", victim)
    await fake.add("pods", synthetic.knative_pod("huge", service="s", cpu="6", uid="h1"))
    client = await watching_client(aiohttp_client, url)
    await eventually(lambda: asyncio.sleep(0, len(client.app[CACHE].snapshot.nodes) == 3))

    async def bind(args: dict[str, str]) -> str:
        response = await client.post("/scheduler/bind", json=args)
        assert response.status == 200
        return str((await response.json())["Error"])

    foreign = {"PodName": "victim", "PodNamespace": "kube-system", "PodUID": "v1", "Node": "cp-1"}
    assert "'default-scheduler', not 'kdrl-scheduler'" in await bind(foreign)
    assert "does not pass the filter" in await bind(binding("pending", "cp-1"))  # the taint
    assert "insufficient cpu" in await bind(binding("huge", "a", uid="h1"))
    assert "unknown to the kdrl cache" in await bind(binding("pending", "nowhere"))
    assert "another uid" in await bind(binding("pending", "a", uid="someone-else"))
    assert fake.bindings == []  # nothing reached the API server
    assert await bind(binding("pending", "b")) == ""  # the plugin's own pod, on a node that fits
    assert len(fake.bindings) == 1
