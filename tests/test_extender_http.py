"""The extender over real HTTP (offline cluster): both node-cache modes, spans, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench import synthetic
from plugin import app as service
from plugin import keys
from plugin.settings import HistorySettings, KubeSettings, PolicySettings, Settings
from tests.conftest import write_objects

Client = TestClient[web.Request, web.Application]


def pending(**kwargs: Any) -> dict[str, Any]:
    return synthetic.knative_pod("hello-abc", service="hello", namespace="shop", uid="uid-1", **kwargs)


async def post(client: Client, verb: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = await client.post(
        f"/scheduler/{verb}", data=data, headers={"Content-Type": "application/json"}
    )
    return response.status, await response.json()


async def test_filter_with_node_names(offline_client: Client) -> None:
    status, result = await post(
        offline_client, "filter", {"Pod": pending(), "Nodes": None, "NodeNames": ["roomy", "full", "gpu"]}
    )
    assert status == 200
    assert result["NodeNames"] == ["roomy"]
    assert result["Nodes"] is None
    assert result["FailedNodes"]["full"].startswith("insufficient cpu")
    assert "untolerated taint nvidia.com/gpu" in result["FailedAndUnresolvableNodes"]["gpu"]
    assert result["Error"] == ""
    assert set(result) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


async def test_filter_with_full_nodes_answers_full_nodes(
    offline_client: Client, small_cluster: tuple[list[dict[str, Any]], list[dict[str, Any]]]
) -> None:
    nodes, _ = small_cluster
    stranger = synthetic.node("stranger", cpu="2", memory="4Gi")  # not in the cache: judged from the object
    body = {"Pod": pending(), "Nodes": {"metadata": {}, "items": [*nodes, stranger]}, "NodeNames": None}
    status, result = await post(offline_client, "filter", body)
    assert status == 200
    assert result["NodeNames"] is None
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["roomy", "stranger"]
    assert result["Nodes"]["items"][0] == nodes[0]  # echoed unchanged
    assert set(result["FailedNodes"]) == {"full"}


async def test_unknown_node_names_fail_with_a_reason(offline_client: Client) -> None:
    status, result = await post(offline_client, "filter", {"Pod": pending(), "NodeNames": ["roomy", "ghost"]})
    assert status == 200
    assert result["NodeNames"] == ["roomy"]
    assert "unknown" in result["FailedNodes"]["ghost"]


async def test_prioritize_scores_0_to_10(offline_client: Client) -> None:
    body = {
        "Pod": pending(
            image=synthetic.image_ref(1), tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]
        ),
        "NodeNames": ["roomy", "full", "gpu", "ghost"],
    }
    status, result = await post(offline_client, "prioritize", body)
    assert status == 200
    scores = {entry["Host"]: entry["Score"] for entry in result}
    assert set(scores) == {"roomy", "full", "gpu"}  # unknown nodes get nothing
    assert all(isinstance(s, int) and 0 <= s <= 10 for s in scores.values())
    assert scores["full"] == 0  # infeasible here
    assert (scores["roomy"], scores["gpu"]) == (10, 0)  # roomy holds the image; otherwise alike


async def test_prioritize_in_full_nodes_mode(
    offline_client: Client, small_cluster: tuple[list[dict[str, Any]], list[dict[str, Any]]]
) -> None:
    nodes, _ = small_cluster
    tolerating = pending(tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}], gpus=1)
    status, result = await post(offline_client, "prioritize", {"Pod": tolerating, "Nodes": {"items": nodes}})
    assert status == 200
    assert {e["Host"]: e["Score"] for e in result} == {"roomy": 0, "full": 0, "gpu": 5}  # gpu alone feasible


async def test_bind_offline_assumes_the_pod(offline_client: Client) -> None:
    await post(offline_client, "filter", {"Pod": pending(cpu="2"), "NodeNames": ["roomy"]})
    status, result = await post(
        offline_client,
        "bind",
        {"PodName": "hello-abc", "PodNamespace": "shop", "PodUID": "uid-1", "Node": "roomy"},
    )
    assert (status, result) == (200, {"Error": ""})
    ready = await (await offline_client.get("/readyz")).json()
    assert ready["ready"] is True


async def test_spans_carry_the_decision(offline_client: Client, spans: InMemorySpanExporter) -> None:
    body = {
        "Pod": pending(priority="critical", image=synthetic.image_ref(1)),
        "NodeNames": ["roomy", "full", "gpu"],
    }
    await post(offline_client, "prioritize", body)
    (span,) = [s for s in spans.get_finished_spans() if s.name == "kdrl.extender.prioritize"]
    attributes = dict(span.attributes or {})
    assert attributes["k8s.pod.name"] == "hello-abc"
    assert attributes["kdrl.function"] == "shop/hello"
    assert attributes["kdrl.priority"] == "critical"
    assert attributes["kdrl.policy"] == "kube-default"
    assert attributes["kdrl.candidates"] == 3
    assert attributes["kdrl.feasible"] == 1
    assert attributes["kdrl.best_node"] == "roomy"
    assert next(iter(attributes["kdrl.top_scores"])).startswith("roomy=")  # type: ignore[arg-type]
    assert attributes["kdrl.snapshot.age_s"] == 0.0


@pytest.mark.parametrize(
    ("verb", "body", "complaint"),
    [
        ("filter", b"{not json", "not valid JSON"),
        ("filter", [], "expected a JSON object"),
        ("prioritize", {"Pod": pending(), "NodeNames": "roomy"}, "NodeNames"),
        ("filter", {"Pod": pending(cpu="1e12"), "NodeNames": ["roomy"]}, "larger than any real node"),
        ("filter", {"Pod": pending(memory="-1Gi"), "NodeNames": ["roomy"]}, "negative"),
        ("prioritize", {"Pod": {"metadata": {"name": 5}}, "NodeNames": []}, "pod.metadata.name"),
        ("bind", {"PodName": "p"}, "Node is required"),
    ],
)
async def test_bad_input_is_a_400_that_says_why(
    offline_client: Client, verb: str, body: Any, complaint: str
) -> None:
    status, result = await post(offline_client, verb, body)
    assert status == 400
    assert complaint in result["Error"]


async def test_oversized_body_is_413(offline_client: Client) -> None:
    limit = offline_client.app[keys.SETTINGS].server.max_body_bytes
    status, result = await post(offline_client, "filter", b" " * (limit + 1))
    assert status == 413
    assert "larger than" in result["Error"]


async def test_health(offline_client: Client) -> None:
    assert (await offline_client.get("/healthz")).status == 200
    response = await offline_client.get("/readyz")
    assert response.status == 200
    detail = await response.json()
    assert detail == {
        "ready": True,
        "mode": "offline",
        "nodes": 3,
        "snapshot_age_s": 0.0,
        "policy": "kube-default",
        "provider": "numpy",
        "degraded": "",
        "model": "",  # kube-default serves no file
    }


async def test_a_missing_model_serves_kube_default_degraded(
    aiohttp_client: Any,
    tmp_path: Path,
    small_cluster: tuple[list[dict[str, Any]], list[dict[str, Any]]],
    spans: InMemorySpanExporter,
) -> None:
    nodes, _ = small_cluster
    settings = Settings(
        kube=KubeSettings(nodes_file=write_objects(tmp_path, "nodes.json", nodes)),
        history=HistorySettings(path=tmp_path / "history.db"),
        policy=PolicySettings(name="onnx", model=tmp_path / "absent.onnx"),
    )
    client = await aiohttp_client(await service.create_app(settings))
    response = await client.get("/readyz")
    detail = await response.json()
    assert response.status == 200  # still serving: the fallback places pods
    assert detail["status"] == "degraded" and detail["policy"] == "kube-default"
    assert "absent.onnx" in detail["degraded"]
    body = {"Pod": pending(image=synthetic.image_ref(1)), "NodeNames": ["roomy", "full", "gpu"]}
    status, result = await post(client, "prioritize", body)
    assert status == 200 and result
    (span,) = [s for s in spans.get_finished_spans() if s.name == "kdrl.extender.prioritize"]
    attributes = dict(span.attributes or {})
    assert attributes["kdrl.policy.fallback"] is True
    assert "absent.onnx" in str(attributes["kdrl.policy.degraded"])


async def test_the_shipped_model_serves(
    aiohttp_client: Any, tmp_path: Path, small_cluster: tuple[list[dict[str, Any]], list[dict[str, Any]]]
) -> None:
    nodes, _ = small_cluster
    settings = Settings(
        kube=KubeSettings(nodes_file=write_objects(tmp_path, "nodes.json", nodes)),
        history=HistorySettings(path=tmp_path / "history.db"),
        policy=PolicySettings(name="onnx", device="cpu"),  # the shipped model
    )
    client = await aiohttp_client(await service.create_app(settings))
    detail = await (await client.get("/readyz")).json()
    assert detail["policy"] == "onnx" and detail["provider"] == "CPUExecutionProvider"
    assert detail["degraded"] == "" and "status" not in detail
    body = {"Pod": pending(image=synthetic.image_ref(1)), "NodeNames": ["roomy", "full", "gpu"]}
    status, result = await post(client, "prioritize", body)
    assert status == 200 and [entry["Host"] for entry in result] == ["roomy", "full", "gpu"]


async def test_prioritize_reuses_the_filter_of_the_same_pod_with_the_same_answer(
    offline_client: Client, spans: InMemorySpanExporter
) -> None:
    tolerating = pending(
        image=synthetic.image_ref(1), tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}]
    )
    _, alone = await post(offline_client, "prioritize", {"Pod": tolerating, "NodeNames": ["roomy", "gpu"]})
    _, filtered = await post(
        offline_client, "filter", {"Pod": tolerating, "NodeNames": ["gpu", "full", "roomy"]}
    )
    assert filtered["NodeNames"] == ["gpu", "roomy"]
    _, reused = await post(
        offline_client, "prioritize", {"Pod": tolerating, "NodeNames": filtered["NodeNames"]}
    )
    other = synthetic.knative_pod("hello-def", service="hello", namespace="shop", uid="uid-2")
    await post(offline_client, "filter", {"Pod": tolerating, "NodeNames": ["gpu", "roomy"]})
    await post(offline_client, "prioritize", {"Pod": other, "NodeNames": ["gpu", "roomy"]})  # another pod
    assert {e["Host"]: e["Score"] for e in reused} == {e["Host"]: e["Score"] for e in alone}
    prioritized = [s for s in spans.get_finished_spans() if s.name == "kdrl.extender.prioritize"]
    assert [s.attributes["kdrl.filter_reused"] for s in prioritized] == [False, True, False]  # type: ignore[index]
    assert prioritized[1].attributes["k8s.pod.uid"] == "uid-1"  # type: ignore[index]


async def test_decisions_are_kept_and_explained(offline_client: Client) -> None:
    names = ["roomy", "full", "gpu", "gone"]
    args = {"Pod": pending(cpu="500m", memory="1Gi"), "Nodes": None, "NodeNames": names}
    status, filtered = await post(offline_client, "filter", args)
    assert status == 200 and filtered["NodeNames"] == ["roomy"]
    assert (await post(offline_client, "prioritize", {**args, "NodeNames": ["roomy"]}))[0] == 200
    binding = {"PodName": "hello-abc", "PodNamespace": "shop", "PodUID": "uid-1", "Node": "roomy"}
    assert (await post(offline_client, "bind", binding))[0] == 200
    response = await offline_client.get("/debug/decisions?limit=5")
    assert response.status == 200
    (decision,) = (await response.json())["decisions"]
    assert decision["pod"] == "shop/hello-abc" and decision["function"] == "shop/hello"
    assert decision["outcome"] == "bound" and decision["bound_node"] == "roomy"
    assert decision["rejections"] == {"cpu": 1, "memory": 1, "taint": 1, "unknown_node": 1}
    assert set(decision["reasons"]) == {"full", "gpu", "gone"}
    assert decision["best_node"] == "roomy" and [c["node"] for c in decision["top"]] == ["roomy"]
    assert set(decision["top"][0]["terms"]) == set(decision["weights"]) != set()
    assert len(decision["trace_id"]) == 32


@pytest.mark.parametrize(
    ("query", "status"), [("limit=abc", 400), ("limit=-1", 400), ("limit=99999999999", 200)]
)
async def test_decisions_limit_is_a_bounded_number(offline_client: Client, query: str, status: int) -> None:
    response = await offline_client.get(f"/debug/decisions?{query}")
    assert response.status == status
    assert ("Error" in await response.json()) == (status == 400)


async def test_the_explorer_page_and_its_files_are_served(offline_client: Client) -> None:
    page = await offline_client.get("/ui")
    assert page.status == 200 and "Read-only" in await page.text()
    for name in ("ui.js", "ui.css"):
        assert (await offline_client.get(f"/ui/static/{name}")).status == 200
    assert (await offline_client.get("/ui/static/../app.py")).status in (403, 404)


async def test_a_big_body_is_decoded_off_the_event_loop_with_the_same_answer(
    offline_client: Client, small_cluster: tuple[list[dict[str, Any]], list[dict[str, Any]]]
) -> None:
    nodes, _ = small_cluster
    small = {"Pod": pending(), "Nodes": {"metadata": {}, "items": nodes}}
    padded = json.loads(json.dumps(small))
    padded["Nodes"]["items"][0]["metadata"]["annotations"] = {"padding": "x" * service.DECODE_INLINE_BYTES}
    body = json.dumps(padded).encode()
    assert len(body) > service.DECODE_INLINE_BYTES
    _, inline = await post(offline_client, "filter", small)
    status, threaded = await post(offline_client, "filter", body)
    assert status == 200 and threaded["FailedNodes"] == inline["FailedNodes"]
    assert [n["metadata"]["name"] for n in threaded["Nodes"]["items"]] == [
        n["metadata"]["name"] for n in inline["Nodes"]["items"]
    ]
