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
