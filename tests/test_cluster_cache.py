"""The watching service against the fake API server, through the real `kubernetes` client."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench import synthetic
from plugin import app as service
from plugin import informer, kube
from plugin.informer import WatchSettings
from plugin.keys import CACHE
from plugin.settings import HistorySettings, KubeSettings, Settings
from tests.conftest import api_client
from tests.fakekube import FakeKube

Client = TestClient[web.Request, web.Application]
FakeApi = tuple[FakeKube, str]


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """Poll until `check` holds: the cache converges over real HTTP, on its own schedule."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def watching_client(aiohttp_client: Any, url: str) -> Client:
    kube = KubeSettings(api_url=url, watch_timeout_s=1, backoff_max_s=0.2, request_timeout_s=2)
    history = HistorySettings(path=Path(tempfile.mkdtemp()) / "history.db")
    settings = Settings(kube=kube, history=history)
    client: Client = await aiohttp_client(await service.create_app(settings))
    return client


async def ready(client: Client) -> bool:
    return (await client.get("/readyz")).status == 200


def node_names(client: Client) -> tuple[str, ...]:
    return tuple(client.app[CACHE].snapshot.nodes.names)


async def seed(fake: FakeKube) -> None:
    await fake.add("nodes", synthetic.node("a", cpu="4", memory="8Gi"))
    await fake.add("nodes", synthetic.node("b", cpu="4", memory="8Gi"))
    await fake.add("pods", synthetic.knative_pod("placed", service="s", cpu="1", node_name="a"))
    await fake.add("pods", synthetic.knative_pod("pending", service="s", cpu="1"))


async def test_lists_then_follows_the_watch(aiohttp_client: Any, fake_kube: FakeApi) -> None:
    fake, url = fake_kube
    await seed(fake)
    client = await watching_client(aiohttp_client, url)
    await eventually(lambda: ready(client))
    table = client.app[CACHE].snapshot.nodes
    assert list(table.names) == ["a", "b"]
    assert list(table.cpu_requested) == [1025, 0]  # the pending pod holds nothing yet
    assert any("fieldSelector=spec.nodeName!=" in unquote(r) for r in fake.requests)

    await fake.add("nodes", synthetic.node("c"))
    await fake.modify("pods", synthetic.knative_pod("pending", service="s", cpu="1", node_name="b"))
    await eventually(lambda: asyncio.sleep(0, node_names(client) == ("a", "b", "c")))
    await eventually(lambda: asyncio.sleep(0, int(client.app[CACHE].snapshot.nodes.cpu_requested[1]) == 1025))
    await fake.delete("pods", "default/placed")
    await fake.delete("nodes", "c")
    await eventually(lambda: asyncio.sleep(0, node_names(client) == ("a", "b")))
    await eventually(lambda: asyncio.sleep(0, int(client.app[CACHE].snapshot.nodes.pod_count[0]) == 0))


async def test_resumes_and_relists_after_410_gone(aiohttp_client: Any, fake_kube: FakeApi) -> None:
    fake, url = fake_kube
    await seed(fake)
    client = await watching_client(aiohttp_client, url)
    await eventually(lambda: ready(client))
    lists_before = sum(r.startswith("GET /api/v1/nodes") and "watch" not in r for r in fake.requests)
    fake.hold = True  # the open watch misses what follows...
    await fake.add("nodes", synthetic.node("late"))
    fake.compact()  # ...and history before now is gone, so resuming from its version gets 410
    seen = len(fake.requests)
    await eventually(
        lambda: asyncio.sleep(0, any("nodes?" in r and "watch" in r for r in fake.requests[seen:]))
    )
    fake.hold = False
    await eventually(lambda: asyncio.sleep(0, "late" in node_names(client)))
    lists_after = sum(r.startswith("GET /api/v1/nodes") and "watch" not in r for r in fake.requests)
    assert lists_after == lists_before + 1
    assert any("resourceVersion=" in r and "watch=true" in r for r in fake.requests)


async def test_keeps_serving_through_an_api_outage(
    aiohttp_client: Any, fake_kube: FakeApi, spans: InMemorySpanExporter
) -> None:
    fake, url = fake_kube
    await seed(fake)
    client = await watching_client(aiohttp_client, url)
    await eventually(lambda: ready(client))
    fake.outage = True
    await eventually(lambda: asyncio.sleep(0, client.app[CACHE].snapshot.stale_since is not None))
    await asyncio.sleep(0.05)
    detail = await (await client.get("/readyz")).json()
    assert detail["ready"] is True and detail["snapshot_age_s"] > 0
    body = {"Pod": synthetic.knative_pod("new", service="s"), "NodeNames": ["a", "b"]}
    response = await client.post("/scheduler/prioritize", json=body)
    assert response.status == 200 and len(await response.json()) == 2
    (span,) = [s for s in spans.get_finished_spans() if s.name == "kdrl.extender.prioritize"]
    assert float(span.attributes["kdrl.snapshot.age_s"]) > 0  # type: ignore[index, arg-type]

    fake.outage = False
    await fake.add("nodes", synthetic.node("after"))
    await eventually(lambda: asyncio.sleep(0, "after" in node_names(client)))
    await eventually(lambda: asyncio.sleep(0, client.app[CACHE].snapshot.stale_since is None))


async def test_not_ready_until_the_first_sync(aiohttp_client: Any, fake_kube: FakeApi) -> None:
    fake, url = fake_kube
    await seed(fake)
    fake.outage = True
    client = await watching_client(aiohttp_client, url)
    await asyncio.sleep(0.1)
    response = await client.get("/readyz")
    assert response.status == 503
    assert (await response.json())["ready"] is False
    fake.outage = False
    await eventually(lambda: ready(client))


class _Recorder:
    def __init__(self) -> None:
        self.lists: list[list[dict[str, Any]]] = []

    def replace(self, items: list[dict[str, Any]]) -> None:
        self.lists.append(items)

    def apply(self, type_: str, obj: dict[str, Any]) -> None:
        pass

    def live(self, live: bool) -> None:
        pass


async def test_an_api_that_is_not_installed_is_said_once_and_looked_for_again(
    fake_kube: FakeApi, caplog: pytest.LogCaptureFixture
) -> None:
    fake, url = fake_kube
    fake.not_served.add("triggers")
    recorder = _Recorder()
    settings = WatchSettings(
        watch_timeout_s=1, backoff_initial_s=0.01, backoff_max_s=0.02, absent_recheck_s=0.05
    )
    caplog.set_level(logging.INFO, logger="plugin.informer")
    async with api_client(url) as api:
        task = asyncio.create_task(informer.follow(kube.triggers(api), recorder, settings))
        await eventually(
            lambda: asyncio.sleep(0, fake.requests.count("GET /apis/eventing.knative.dev/v1/triggers") >= 5)
        )
        absent = [r for r in caplog.records if "Eventing is not installed" in r.getMessage()]
        assert len(absent) == 1 and absent[0].levelno == logging.INFO
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        fake.not_served.clear()  # Eventing installed meanwhile: found on the next look
        await eventually(lambda: asyncio.sleep(0, bool(recorder.lists)))
        assert any("served now" in r.getMessage() for r in caplog.records)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
