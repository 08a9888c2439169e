"""The CloudEvents sink: content modes, counts, dedup, answers, spans, durability across kill -9."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from cloudevents.core.bindings.http import to_binary_event, to_structured_event
from cloudevents.core.v1.event import CloudEvent
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench import extender as extender_bench
from forecaster.history import HistoryStore
from plugin import keys
from prewarm.planning import DEFAULT_COLD_START_S
from tests.conftest import EXAMPLES

Client = TestClient[web.Request, web.Application]
NOW = datetime.now(tz=UTC).replace(second=0, microsecond=0)
START = NOW.isoformat().replace("+00:00", "Z")


def report(function: str = "shop/cart", count: int = 3, **extra: Any) -> dict[str, Any]:
    return {"function": function, "start": START, "seconds": 60, "count": count, **extra}


def event(
    data: Any, *, id_: str = "e1", type_: str = "dev.kdrl.invocations.v1", **extensions: str
) -> CloudEvent:
    attributes = {
        "type": type_,
        "source": "/adapters/gateway",
        "id": id_,
        "datacontenttype": "application/json",
    }
    return CloudEvent(attributes={**attributes, **extensions}, data=data)


async def post_binary(client: Client, e: CloudEvent) -> int:
    message = to_binary_event(e)
    response = await client.post("/events", data=message.body, headers=message.headers)
    assert await response.read() == b""  # Eventing reads a non-empty body as a reply event
    return response.status


def minute_count(client: Client, function: str = "shop/cart") -> int:
    sink = client.app[keys.EVENTS]
    return int(sink.counts.series(function, int(NOW.timestamp() // 60) + 1, 1)[0])


async def test_binary_mode_counts(offline_client: Client) -> None:
    assert await post_binary(offline_client, event(report(count=3))) == 202
    assert minute_count(offline_client) == 3


async def test_structured_mode_and_a_list_of_reports(offline_client: Client) -> None:
    message = to_structured_event(event([report(count=2), report("shop/pay", 5)], id_="s1"))
    response = await offline_client.post("/", data=message.body, headers=message.headers)
    assert response.status == 202
    assert (minute_count(offline_client), minute_count(offline_client, "shop/pay")) == (2, 5)


async def test_batched_mode(offline_client: Client) -> None:
    items = [json.loads(to_structured_event(event(report(count=1), id_=f"b{i}")).body) for i in range(4)]
    response = await offline_client.post(
        "/events", data=json.dumps(items), headers={"Content-Type": "application/cloudevents-batch+json"}
    )
    assert response.status == 202
    assert minute_count(offline_client) == 4


async def test_redelivery_counts_once(offline_client: Client) -> None:
    for _ in range(3):
        assert await post_binary(offline_client, event(report(count=7), id_="same")) == 202
    assert minute_count(offline_client) == 7


async def test_a_window_spreads_over_its_minutes(offline_client: Client) -> None:
    assert await post_binary(offline_client, event(report(count=10, seconds=180))) == 202
    sink = offline_client.app[keys.EVENTS]
    first = int(NOW.timestamp() // 60)
    assert list(sink.counts.series("shop/cart", first + 3, 3)) == [4, 3, 3]


async def test_unknown_types_are_acknowledged_and_counted(offline_client: Client) -> None:
    assert await post_binary(offline_client, event({"x": 1}, type_="com.example.other")) == 202
    assert offline_client.app[keys.EVENTS].unknown_types["com.example.other"] == 1


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        (report(count=-1), "count"),
        (report(count=10**12), "count"),
        (report(function="no-namespace"), "function"),
        (report(start="yesterday"), "start"),
        (report(start="2001-01-01T00:00:00Z"), "too far"),
        (report(start="2999-01-01T00:00:00Z"), "too far"),
        (report(seconds=0), "seconds"),
        ("just text", "expected an object"),
    ],
)
async def test_bad_reports_are_400(offline_client: Client, data: Any, complaint: str) -> None:
    message = to_binary_event(event(data))
    response = await offline_client.post("/events", data=message.body, headers=message.headers)
    assert response.status == 400
    assert complaint in (await response.json())["Error"]
    assert offline_client.app[keys.EVENTS].counts.functions == []  # nothing half-counted


@pytest.mark.parametrize(
    ("headers", "body"),
    [
        ({"Content-Type": "application/cloudevents+json"}, b"{not json"),
        ({"Content-Type": "application/cloudevents+json"}, b'{"specversion": "1.0", "source": "/s"}'),
        ({"Content-Type": "application/cloudevents-batch+json"}, b'{"not": "a list"}'),
    ],
)
async def test_malformed_events_are_400(offline_client: Client, headers: dict[str, str], body: bytes) -> None:
    response = await offline_client.post("/events", data=body, headers=headers)
    assert response.status == 400


async def test_oversized_body_is_413(offline_client: Client) -> None:
    limit = offline_client.app[keys.SETTINGS].history.events_max_body_bytes
    message = to_binary_event(event(report(padding="x" * limit)))
    response = await offline_client.post("/events", data=message.body, headers=message.headers)
    assert response.status == 413


async def test_a_full_queue_is_429(offline_client: Client) -> None:
    offline_client.app[keys.EVENTS].max_pending = 0
    assert await post_binary(offline_client, event(report())) == 429


async def test_spans_continue_the_event_trace(offline_client: Client, spans: InMemorySpanExporter) -> None:
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    await post_binary(offline_client, event(report(), id_="t1", traceparent=traceparent))
    (span,) = [s for s in spans.get_finished_spans() if s.name.startswith("dev.kdrl.invocations.v1")]
    assert f"{span.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert span.parent is not None and f"{span.parent.span_id:016x}" == "b7ad6b7169203331"
    attributes = dict(span.attributes or {})
    assert attributes["cloudevents.event_id"] == "t1"
    assert attributes["cloudevents.event_source"] == "/adapters/gateway"
    assert attributes["cloudevents.event_type"] == "dev.kdrl.invocations.v1"


async def test_debug_views(offline_client: Client) -> None:
    await post_binary(offline_client, event(report(count=4)))
    listing = await (await offline_client.get("/debug/functions")).json()
    assert listing == {"functions": ["shop/cart"], "patterns": {}}  # no forecast cycle offline yet
    detail = await (await offline_client.get("/debug/functions/shop/cart?hours=1")).json()
    assert detail["function"] == "shop/cart" and sum(detail["counts"]) == 4 and len(detail["counts"]) == 60
    # no pod seen start yet: the planner prices the default
    assert detail["observed_cold_starts_s"] == [] and detail["cold_start_estimate_s"] == DEFAULT_COLD_START_S
    assert (await offline_client.get("/debug/functions/shop/none")).status == 404


def test_acknowledged_events_survive_kill_9(tmp_path: Path) -> None:
    database = tmp_path / "history.db"
    server, port, _ = extender_bench.serve_offline(
        EXAMPLES / "nodes.json", EXAMPLES / "pods.json", "--history-path", str(database)
    )
    acknowledged = 0
    try:
        for i in range(40):
            message = to_binary_event(event(report(count=1), id_=f"k{i}"))
            request = urllib.request.Request(f"http://127.0.0.1:{port}/events", message.body, message.headers)
            with urllib.request.urlopen(request, timeout=5) as response:
                acknowledged += response.status == 202
    finally:
        os.kill(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
    assert acknowledged == 40
    store = HistoryStore(database)
    assert sum(int(store.series(f, 0)[:, 1].sum()) for f in store.recency(0)) == 40
    store.close()
    restarted, port, _ = extender_bench.serve_offline(
        EXAMPLES / "nodes.json", EXAMPLES / "pods.json", "--history-path", str(database)
    )
    try:
        url = f"http://127.0.0.1:{port}/debug/functions/shop/cart?hours=1"
        with urllib.request.urlopen(url, timeout=5) as response:
            assert sum(json.loads(response.read())["counts"]) == 40
    finally:
        restarted.terminate()
        restarted.wait(timeout=10)


def apiserver_event(kind: str, change: str, obj: dict[str, Any], id_: str) -> CloudEvent:
    attributes = {
        "type": f"dev.knative.apiserver.resource.{change}",
        "source": "https://10.96.0.1:443",
        "id": id_,
        "datacontenttype": "application/json",
        "subject": f"/apis/v1/namespaces/shop/{kind.lower()}s/{obj['metadata']['name']}",
    }
    return CloudEvent(attributes=attributes, data={"kind": kind, "apiVersion": "v1", **obj})


def knative_pod(ready_at: str | None = None) -> dict[str, Any]:
    labels = {"serving.knative.dev/service": "cart", "serving.knative.dev/revision": "cart-00002"}
    pod: dict[str, Any] = {
        "metadata": {
            "name": "cart-00002-deployment-abc",
            "namespace": "shop",
            "uid": "pod-1",
            "labels": labels,
            "creationTimestamp": START,
        },
        "status": {"conditions": []},
    }
    if ready_at:
        pod["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastTransitionTime": ready_at}]
    return pod


async def test_apiserversource_pods_and_revisions(offline_client: Client) -> None:
    ready = (NOW + timedelta(seconds=3.5)).isoformat().replace("+00:00", "Z")
    revision = {
        "metadata": {
            "name": "cart-00002",
            "namespace": "shop",
            "labels": {"serving.knative.dev/service": "cart", "serving.knative.dev/routingState": "active"},
        }
    }
    for i, e in enumerate(
        [
            apiserver_event("Revision", "add", revision, "r1"),
            apiserver_event("Pod", "add", knative_pod(), "p1"),
            apiserver_event("Pod", "update", knative_pod(ready), "p2"),
            apiserver_event("Pod", "update", knative_pod(ready), "p3"),  # no second cold start
        ]
    ):
        assert await post_binary(offline_client, e) == 202, i
    detail = await (await offline_client.get("/debug/functions/shop/cart")).json()
    assert detail["routed_revision"] == "cart-00002"
    assert detail["running_pods"] == 1
    assert detail["observed_cold_starts_s"] == [3.5]
    assert detail["cold_start_estimate_s"] == 3.5  # what the planner prices, the median of those
    assert (
        await post_binary(offline_client, apiserver_event("Pod", "delete", knative_pod(ready), "p4")) == 202
    )
    detail = await (await offline_client.get("/debug/functions/shop/cart")).json()
    assert detail["running_pods"] == 0


async def test_apiserversource_ignores_pods_of_no_function(offline_client: Client) -> None:
    plain = {"metadata": {"name": "nginx", "namespace": "web", "uid": "x", "labels": {"app": "nginx"}}}
    assert await post_binary(offline_client, apiserver_event("Pod", "add", plain, "n1")) == 202
    assert offline_client.app[keys.EVENTS].lifecycle.pods == {}


async def test_apiserversource_bad_timestamp_is_400(offline_client: Client) -> None:
    pod = knative_pod()
    pod["metadata"]["creationTimestamp"] = "last tuesday"
    message = to_binary_event(apiserver_event("Pod", "add", pod, "bad"))
    response = await offline_client.post("/events", data=message.body, headers=message.headers)
    assert response.status == 400 and "creationTimestamp" in (await response.json())["Error"]


async def test_debug_view_carries_the_forecast(offline_client: Client) -> None:
    minute = int(NOW.timestamp() // 60)
    for back in range(0, 120, 3):
        start = datetime.fromtimestamp((minute - back) * 60, tz=UTC).isoformat().replace("+00:00", "Z")
        assert await post_binary(offline_client, event(report(count=2, start=start), id_=f"f{back}")) == 202
    loop = offline_client.app[keys.FORECASTS]
    loop.cycle(True)
    detail = await (await offline_client.get("/debug/functions/shop/cart")).json()
    forecast = detail["forecast"]
    assert len(forecast["expected"]) == len(forecast["p_invoked"]) == 30
    assert forecast["model"] in {"CrostonSBA", "ADIDA", "IMAPA", "TSB", "Naive"}


def test_metrics_count_unknown_event_types(tmp_path: Path) -> None:
    server, port, _ = extender_bench.serve_offline(
        EXAMPLES / "nodes.json", EXAMPLES / "pods.json", "--history-path", str(tmp_path / "h.db")
    )
    try:
        message = to_binary_event(event({"x": 1}, type_="com.example.unheard-of", id_="u1"))
        request = urllib.request.Request(f"http://127.0.0.1:{port}/events", message.body, message.headers)
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 202
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    finally:
        server.terminate()
        server.wait(timeout=10)
    line = next(row for row in text.splitlines() if row.startswith("kdrl_events_unknown_total{"))
    assert 'cloudevents_event_type="com.example.unheard-of"' in line and line.endswith(" 1.0")
