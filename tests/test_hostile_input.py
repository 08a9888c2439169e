"""The malformed inputs an outside attack found answering 500 (issue 19): each now gets a 4xx
that names what is wrong, and the service keeps serving."""

from __future__ import annotations

import asyncio
import copy
import gzip
import json
import logging
import random
import select
import socket
import sqlite3
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from cloudevents.core.bindings.http import to_binary_event, to_structured_event
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import extender as extender_bench
from bench import fuzz, synthetic
from forecaster.history import Count, Effect, HistoryStore, MinuteCounts
from plugin import app as service
from plugin import logs
from plugin.events import INVOCATIONS, EventSink
from plugin.settings import HistorySettings, KubeSettings, Settings
from policies import heuristics, onnx_policy
from policies.types import Node, NodeTable, PodRequest
from tests.conftest import EXAMPLES, metric, write_objects
from tests.test_events import event, report

Client = TestClient[web.Request, web.Application]
POD = synthetic.knative_pod("p", service="s", namespace="shop", uid="u1")
NAMES = ["roomy", "full", "gpu"]


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def with_cpu(value: str) -> dict[str, Any]:
    pod = json.loads(json.dumps(POD))
    pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = value
    return pod


def huge_image_node() -> dict[str, Any]:
    node = synthetic.node("n", cpu="4", memory="8Gi")
    node["status"]["images"] = [{"names": ["registry.example.com/a:1"], "sizeBytes": 2**63}]
    return node


CASES: list[tuple[str, str, bytes, dict[str, str]]] = [
    ("deep nesting", "/scheduler/filter", nested(5000).encode(), {}),
    ("deep nesting, prioritize", "/scheduler/prioritize", ('{"Pod":' + nested(3000) + "}").encode(), {}),
    (
        "cpu 1e1000000",
        "/scheduler/filter",
        json.dumps({"Pod": with_cpu("1e1000000"), "NodeNames": NAMES}).encode(),
        {},
    ),
    (
        "sizeBytes 2^63",
        "/scheduler/prioritize",
        json.dumps({"Pod": POD, "Nodes": {"metadata": {}, "items": [huge_image_node()]}}).encode(),
        {},
    ),
    (
        "Nodes.items not a list",
        "/scheduler/filter",
        json.dumps({"Pod": POD, "Nodes": {"items": 5}}).encode(),
        {},
    ),
    (
        "Nodes.items[] not objects",
        "/scheduler/filter",
        json.dumps({"Pod": POD, "Nodes": {"items": [1, "x"]}}).encode(),
        {},
    ),
    (
        "Nodes.metadata a string",
        "/scheduler/filter",
        json.dumps({"Pod": POD, "Nodes": {"metadata": "x", "items": []}}).encode(),
        {},
    ),
    (
        "node metadata a list",
        "/scheduler/filter",
        json.dumps({"Pod": POD, "Nodes": {"items": [{"metadata": []}]}}).encode(),
        {},
    ),
    ("mutate-pods []", "/mutate-pods", b"[]", {}),
    ("mutate-pods request a string", "/mutate-pods", json.dumps({"request": "x"}).encode(), {}),
    (
        "mutate-pods object a list",
        "/mutate-pods",
        json.dumps({"request": {"uid": "1", "object": []}}).encode(),
        {},
    ),
]


@pytest.mark.parametrize(("case", "path", "body", "headers"), CASES, ids=[c[0] for c in CASES])
async def test_malformed_bodies_get_4xx(
    offline_client: Client, case: str, path: str, body: bytes, headers: dict[str, str]
) -> None:
    response = await offline_client.post(
        path, data=body, headers={"Content-Type": "application/json", **headers}
    )
    assert 400 <= response.status < 500, (case, response.status, await response.text())
    assert (await offline_client.get("/healthz")).status == 200


def apiserver_event(data: Any, type_: str = "dev.knative.apiserver.resource.update") -> dict[str, str]:
    return {
        "ce-specversion": "1.0",
        "ce-id": "x1",
        "ce-source": "/apis/v1/namespaces/shop",
        "ce-type": type_,
        "Content-Type": "application/json",
    }


SERVICE_LABEL, REVISION = "serving.knative.dev/service", "serving.knative.dev/revision"
SERVICE = {SERVICE_LABEL: "s"}
EVENT_DATA = [
    ("pod metadata a list", {"kind": "Pod", "metadata": ["x"]}),
    ("pod labels a string", {"kind": "Pod", "metadata": {"namespace": "shop", "labels": "x"}}),
    (
        "conditions not a list",
        {
            "kind": "Pod",
            "metadata": {"namespace": "shop", "labels": {"serving.knative.dev/service": "s"}},
            "status": {"conditions": 5},
        },
    ),
    (
        "status a string",
        {
            "kind": "Pod",
            "metadata": {"namespace": "shop", "labels": {"serving.knative.dev/service": "s"}},
            "status": "x",
        },
    ),
    (
        "namespace a number",
        {"kind": "Pod", "metadata": {"namespace": 5, "labels": {"serving.knative.dev/service": "s"}}},
    ),
    # Found by bench.fuzz (1,000,000 bodies): a pod's uid with a lone surrogate reached SQLite (500).
    (
        "uid a lone surrogate",
        {"kind": "Pod", "metadata": {"uid": "\ud800", "namespace": "shop", "labels": SERVICE}},
    ),
    ("uid a number", {"kind": "Pod", "metadata": {"uid": 7, "namespace": "shop", "labels": SERVICE}}),
    ("no uid, no name", {"kind": "Pod", "metadata": {"namespace": "shop", "labels": SERVICE}}),
    (
        "revision label not a name",
        {
            "kind": "Pod",
            "metadata": {"uid": "u", "namespace": "shop", "labels": {**SERVICE, REVISION: "\ud800"}},
        },
    ),
    ("service label not a name", {"kind": "Pod", "metadata": {"uid": "u", "labels": {SERVICE_LABEL: "A/b"}}}),
    (
        "routed revision not a name",
        {
            "kind": "Revision",
            "metadata": {"name": "x\ny", "labels": {**SERVICE, "serving.knative.dev/routingState": "active"}},
        },
    ),
]


async def test_a_condition_of_an_unknown_type_is_ignored(offline_client: Client) -> None:
    """Found by bench.fuzz: a condition whose type is a list (it was a 500: unhashable)."""
    data = {
        "kind": "Pod",
        "metadata": {"name": "p", "uid": "u1", "namespace": "shop", "labels": SERVICE},
        "status": {"conditions": [{"type": ["Ready"], "status": "True"}]},
    }
    response = await offline_client.post("/events", data=json.dumps(data), headers=apiserver_event(data))
    assert response.status == 202, await response.text()


@pytest.mark.parametrize(("case", "data"), EVENT_DATA, ids=[c[0] for c in EVENT_DATA])
async def test_events_of_the_wrong_shape_get_400(offline_client: Client, case: str, data: Any) -> None:
    response = await offline_client.post("/events", data=json.dumps(data), headers=apiserver_event(data))
    assert response.status == 400, (case, response.status, await response.text())


@pytest.mark.parametrize("hours", ["nan", "inf", "-inf", "1e400", "x"])
async def test_hours_must_be_a_finite_number(offline_client: Client, hours: str) -> None:
    now = datetime.now(UTC).isoformat()
    message = to_binary_event(event({"function": "shop/s", "start": now, "seconds": 60, "count": 1}))
    assert (await offline_client.post("/events", data=message.body, headers=message.headers)).status == 202
    assert (await offline_client.get("/debug/functions/shop/s?hours=2")).status == 200
    response = await offline_client.get(f"/debug/functions/shop/s?hours={hours}")
    assert response.status == 400, await response.text()


@pytest.mark.parametrize(
    ("body", "status"),
    [(b'{"Pod": {}}', 400), (gzip.compress(json.dumps({"Pod": POD, "NodeNames": NAMES}).encode()), 200)],
    ids=["plain body said to be gzip", "real gzip"],
)
def test_content_encoding_is_honoured_or_refused(body: bytes, status: int) -> None:
    """Over a real socket (`kdrl serve`): aiohttp closes the connection after a body it cannot
    decode, which the in-process test client reports as a disconnect instead of the 400;
    and logs it once, as the 400 it is, not again as an unhandled exception."""
    server, port, _ = extender_bench.serve_offline(
        EXAMPLES / "nodes.json", EXAMPLES / "pods.json", capture_logs=True
    )
    try:
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/scheduler/filter",
            data=body,
            headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                answered = response.status
        except urllib.error.HTTPError as error:
            answered = error.code
            assert "could not be read" in error.read().decode()
        assert answered == status
    finally:
        server.terminate()
        _, logged = server.communicate(timeout=20)
    assert b"ERROR" not in logged and b"Traceback" not in logged, logged.decode()[-2000:]


class RefusingStore(HistoryStore):
    """A database that refuses any transaction holding `shop/poison` (as SQLite refused a
    lone surrogate before names were validated)."""

    def record(self, batches: Sequence[tuple[tuple[str, str] | None, Effect]], now: float) -> list[bool]:
        if any(c.function == "shop/poison" for _, effect in batches for c in effect.counts):
            raise sqlite3.OperationalError("refused")
        return super().record(batches, now)


async def test_a_poison_request_fails_alone_in_its_group_commit(tmp_path: Path) -> None:
    sink = EventSink(store=RefusingStore(tmp_path / "h.db"), counts=MinuteCounts(), clock=lambda: 60_000.0)
    runner = asyncio.create_task(sink.run())

    async def send(i: int) -> bool | Exception:
        function = "shop/poison" if i == 7 else "shop/cart"
        try:
            return (await sink.commit([(("src", f"e{i}"), Effect(counts=[Count(function, 1000, 1)]))]))[0]
        except Exception as error:
            return error

    answers = await asyncio.gather(*(send(i) for i in range(50)))  # queued together: one group
    runner.cancel()
    await sink.close()
    assert isinstance(answers[7], sqlite3.OperationalError)
    assert [a for i, a in enumerate(answers) if i != 7] == [True] * 49
    assert sink.counts.series("shop/cart", 1001, 1).tolist() == [49]
    assert "shop/poison" not in sink.counts.functions


@pytest.mark.parametrize(
    "function", ["a/\ud800", "shop/<img src=x>", "Shop/Cart", "shop/" + "x" * 64, "shop", "a/b/c"]
)
async def test_an_invalid_function_name_is_refused_alone(offline_client: Client, function: str) -> None:
    now = datetime.now(UTC).isoformat()
    report = {"function": function, "start": now, "seconds": 60, "count": 1}
    body = json.dumps({"specversion": "1.0", "id": "p1", "source": "/a", "type": INVOCATIONS, "data": report})
    headers = {"Content-Type": "application/cloudevents+json"}
    response = await offline_client.post("/events", data=body.encode(), headers=headers)
    assert response.status == 400 and "Kubernetes names" in (await response.json())["Error"]


async def test_an_event_id_that_is_not_utf8_is_refused(offline_client: Client) -> None:
    body = json.dumps(
        {"specversion": "1.0", "id": "\udcff", "source": "/a", "type": "com.example.x", "data": {}}
    )
    headers = {"Content-Type": "application/cloudevents+json"}
    response = await offline_client.post("/events", data=body.encode(), headers=headers)
    assert response.status == 400 and "UTF-8" in (await response.json())["Error"]


def shipped_with(change: Callable[[onnx.ModelProto], None], path: Path) -> Path:
    model = onnx.load(str(onnx_policy.DEFAULT_MODEL))
    change(model)
    onnx.save(model, str(path))
    return path


def rename_output(model: onnx.ModelProto) -> None:
    old = model.graph.output[0].name
    model.graph.output[0].name = "scores"
    for node in model.graph.node:
        node.output[:] = ["scores" if name == old else name for name in node.output]


def sum_everything(model: onnx.ModelProto) -> None:
    """The right names, the wrong shape: one number for all nodes."""
    graph = model.graph
    graph.output[0].name = "unused"
    for node in graph.node:
        node.output[:] = ["unused" if name == onnx_policy.OUTPUT else name for name in node.output]
    graph.node.append(onnx.helper.make_node("ReduceSum", ["nodes"], [onnx_policy.OUTPUT], keepdims=0))
    graph.output[0].CopyFrom(
        onnx.helper.make_tensor_value_info(onnx_policy.OUTPUT, onnx.TensorProto.FLOAT, [])
    )


@pytest.mark.parametrize(("change", "says"), [(rename_output, "outputs"), (sum_everything, "shape")])
def test_a_model_that_does_not_match_the_schema_falls_back_at_load(
    tmp_path: Path, change: Callable[[onnx.ModelProto], None], says: str
) -> None:
    loaded = onnx_policy.load(shipped_with(change, tmp_path / "bad.onnx"), device="cpu")
    assert loaded.policy.name == "kube-default" and says in loaded.degraded, loaded.degraded


def test_an_inference_error_falls_back_for_that_request_only(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = onnx_policy.load(device="cpu")
    policy = loaded.policy
    assert isinstance(policy, onnx_policy.OnnxPolicy)
    nodes = NodeTable.from_nodes(
        [Node(name=f"n{i}", cpu_allocatable=4000, memory_allocatable=8 << 30) for i in range(4)]
    )
    pod = PodRequest(namespace="shop", name="p", cpu_milli=100, memory_bytes=1 << 28)
    learned = policy.score(pod, nodes)
    real_run = policy.session.run

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(policy.session, "run", broken)
    fallback = policy.score(pod, nodes)
    assert np.array_equal(fallback, heuristics.kube_default().score(pod, nodes)) and policy.failures == 1
    monkeypatch.setattr(policy.session, "run", real_run)
    assert np.array_equal(policy.score(pod, nodes), learned)  # the next request is the model's again


def test_a_name_with_a_newline_cannot_forge_a_log_line() -> None:
    record = logging.LogRecord(
        "plugin.extender", logging.WARNING, __file__, 1, "bind refused: %s", ("x\nERROR forged\r",), None
    )
    plain = logs.PlainFormatter().format(record)
    assert "\n" not in plain and plain.endswith("bind refused: x\\nERROR forged\\r")
    assert "\n" not in logs.JsonFormatter().format(record)


# Made once: hypothesis replays a failing case, which must draw from the very same documents.
FUZZ_SEEDS = fuzz.seeds()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rng=st.randoms(use_true_random=False), which=st.integers(min_value=0, max_value=len(FUZZ_SEEDS) - 1))
async def test_structured_mutations_of_every_endpoint_never_get_a_5xx(
    offline_client: Client, rng: random.Random, which: int
) -> None:
    """`bench.fuzz`'s mutator (valid requests of each endpoint, mutated where they are
    structured), its choices drawn by hypothesis; `python -m bench.fuzz` runs it by the million.
    Nor may any of them break the metrics scrape that follows (a label it poisoned did)."""
    request = fuzz.mutated(FUZZ_SEEDS[which], rng)
    if request.headers.get("Content-Encoding"):
        return  # the test client reports aiohttp's closed connection as an error: bench.fuzz covers it
    response = await offline_client.request(
        request.method, request.path, data=request.body or None, headers=request.headers
    )
    assert response.status < 500, (request.path, response.status, await response.text())
    scrape = await offline_client.get("/metrics")
    assert scrape.status == 200, (request.path, await scrape.text())


def test_the_mutator_changes_neither_its_seeds_nor_its_hostile_values() -> None:
    """Hypothesis replays a case by drawing again: a mutator that changed shared state would not replay."""
    hostile, documents = copy.deepcopy(fuzz.HOSTILE), copy.deepcopy([seed.document for seed in FUZZ_SEEDS])
    rng = random.Random(7)
    for _ in range(3000):
        fuzz.mutated(rng.choice(FUZZ_SEEDS), rng)
    assert hostile == fuzz.HOSTILE and [seed.document for seed in FUZZ_SEEDS] == documents


async def test_a_flood_of_function_names_stays_under_the_cap_and_the_database_keeps_them(
    aiohttp_client: Any, tmp_path: Path, small_cluster: tuple[list[dict[str, Any]], list[dict[str, Any]]]
) -> None:
    nodes, pods = small_cluster
    settings = Settings(
        kube=KubeSettings(
            nodes_file=write_objects(tmp_path, "nodes.json", nodes),
            pods_file=write_objects(tmp_path, "pods.json", pods),
        ),
        history=HistorySettings(path=tmp_path / "h.db", max_functions=20),
    )
    client: Client = await aiohttp_client(await service.create_app(settings))
    for batch in range(4):
        reports = [report(f"flood/f{batch * 50 + i}", count=1) for i in range(50)]
        message = to_structured_event(event(reports, id_=f"flood-{batch}"))
        response = await client.post("/events", data=message.body, headers=message.headers)
        assert response.status == 202, await response.text()
    listed = (await (await client.get("/debug/functions")).json())["functions"]
    assert len(listed) == 20 and "flood/f199" in listed  # the most recent names stay
    assert (await client.get("/metrics")).status == 200  # a scrape samples the gauges
    assert metric("kdrl.history.functions") == 20
    assert metric("kdrl.history.forgotten", kdrl_reason="evicted") == 180
    with sqlite3.connect(tmp_path / "h.db") as db:  # every acknowledged count is durable
        assert db.execute("SELECT count(DISTINCT function), sum(count) FROM minutes").fetchone() == (200, 200)


def _closed_within(connection: socket.socket, seconds: float) -> tuple[bytes, float]:
    """What the server sent until it closed the connection, and when (or after `seconds`)."""
    started, received = time.monotonic(), b""
    connection.settimeout(0.2)
    while time.monotonic() - started < seconds:
        try:
            chunk = connection.recv(4096)
        except TimeoutError:
            continue
        if not chunk:
            break
        received += chunk
    return received, time.monotonic() - started


def test_slow_clients_are_cut_off_headers_and_bodies_alike() -> None:
    """Slowloris: headers dripped a byte at a time are cut at KDRL_IDLE_TIMEOUT_S, a body that
    stalls gets 408 at KDRL_BODY_TIMEOUT_S, and a fresh client is answered meanwhile."""
    env = {"KDRL_IDLE_TIMEOUT_S": "1", "KDRL_BODY_TIMEOUT_S": "1"}
    server, port, _ = extender_bench.serve_offline(EXAMPLES / "nodes.json", EXAMPLES / "pods.json", env=env)
    try:
        dripping = socket.create_connection(("127.0.0.1", port))
        stalled = socket.create_connection(("127.0.0.1", port))
        stalled.sendall(b"POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
        started = time.monotonic()
        for byte in b"POST /events HTTP/1.1\r\nHost: x\r\nX-Slow: ":
            dripping.sendall(bytes([byte]))
            if not select.select([dripping], [], [], 0.1)[0]:
                continue
            break  # the server spoke (or closed) before the headers ended
        received, _ = _closed_within(dripping, 5)
        assert received == b"" and time.monotonic() - started < 5  # closed, no request seen
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            assert response.status == 200
        answer, after = _closed_within(stalled, 5)
        assert answer.startswith(b"HTTP/1.1 408") and b"not received within 1 s" in answer and after < 5
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.parametrize("field", ["type", "source"])
async def test_a_lone_surrogate_in_an_event_never_breaks_the_metrics_scrape(
    offline_client: Client, field: str
) -> None:
    """Found by the suite's fuzzing: an event type with a lone surrogate became a metric label,
    and every later scrape of /metrics failed (500) for the life of the process."""
    event = {"specversion": "1.0", "id": f"s-{field}", "source": "/a", "type": "com.example.x", "data": {}}
    event[field] = event[field] + "\ud800"
    headers = {"Content-Type": "application/cloudevents+json"}
    response = await offline_client.post("/events", data=json.dumps(event).encode(), headers=headers)
    assert response.status == 400 and f"{field} is not valid UTF-8" in (await response.json())["Error"]
    scrape = await offline_client.get("/metrics")
    assert scrape.status == 200, await scrape.text()
