"""The closed loop's record: each placement the extender served, as the model saw it, and what
became of the pod (`plugin/decision_recorder.py`, `policies/decision_records.py`)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cloudevents.core.bindings.http import to_binary_event
from cloudevents.core.v1.event import CloudEvent

from bench import synthetic
from plugin import app as service
from plugin.decision_recorder import DecisionRecorder
from plugin.keys import EXTENDER, RECORDER
from plugin.settings import HistorySettings, KubeSettings, PolicySettings, Settings
from policies import features
from policies.decision_records import DecisionStore, Record
from policies.types import Node, NodeTable, PodRequest, Priority
from tests.conftest import metric, write_objects
from tests.test_extender_http import post

NAMES = ["roomy", "full", "gpu"]


@pytest.fixture
async def client(
    aiohttp_client: Any, tmp_path: Path, small_cluster: tuple[list[dict[str, Any]], list[dict[str, Any]]]
) -> Any:
    nodes, pods = small_cluster
    settings = Settings(
        kube=KubeSettings(
            nodes_file=write_objects(tmp_path, "nodes.json", nodes),
            pods_file=write_objects(tmp_path, "pods.json", pods),
        ),
        history=HistorySettings(path=tmp_path / "history.db"),
        policy=PolicySettings(name="onnx", device="cpu"),
    )
    return await aiohttp_client(await service.create_app(settings))


def pod(uid: str, created: datetime, **status: Any) -> dict[str, Any]:
    obj = synthetic.knative_pod(
        f"hello-{uid}", service="hello", namespace="shop", uid=uid, image=synthetic.image_ref(1)
    )
    obj["metadata"]["creationTimestamp"] = created.isoformat()
    if status:
        obj["status"] = status
    return obj


async def place(client: Any, obj: dict[str, Any], names: list[str] = NAMES) -> str | None:
    """filter, prioritize and bind, as kube-scheduler calls them; returns the bound node, None
    when bind refused it (the extender's snapshot may count a just-bound pod later than its
    bind does: kube-scheduler retries such a pod)."""
    _, filtered = await post(client, "filter", {"Pod": obj, "NodeNames": names})
    _, ranked = await post(client, "prioritize", {"Pod": obj, "NodeNames": filtered["NodeNames"]})
    node = max(ranked, key=lambda e: e["Score"])["Host"]
    binding = {
        "PodName": obj["metadata"]["name"],
        "PodNamespace": obj["metadata"]["namespace"],
        "PodUID": obj["metadata"]["uid"],
        "Node": node,
    }
    status, answer = await post(client, "bind", binding)
    assert status == 200
    return None if answer["Error"] else str(node)


async def ready(
    client: Any, obj: dict[str, Any], created: datetime, bound_after: float, ready_after: float
) -> None:
    conditions = [
        {
            "type": "PodScheduled",
            "status": "True",
            "lastTransitionTime": (created + timedelta(seconds=bound_after)).isoformat(),
        },
        {
            "type": "Ready",
            "status": "True",
            "lastTransitionTime": (created + timedelta(seconds=ready_after)).isoformat(),
        },
    ]
    attributes = {
        "type": "dev.knative.apiserver.resource.update",
        "source": "https://10.96.0.1:443",
        "id": f"ready-{obj['metadata']['uid']}",
        "datacontenttype": "application/json",
    }
    data = {"kind": "Pod", "apiVersion": "v1", **obj, "status": {"conditions": conditions}}
    message = to_binary_event(CloudEvent(attributes=attributes, data=data))
    response = await client.post("/events", data=message.body, headers=message.headers)
    assert response.status == 202, await response.text()


def records(path: Path) -> list[Record]:
    store = DecisionStore(path, create=False)
    skipped: Counter[str] = Counter()
    found = list(store.read(skipped))
    store.close()
    assert not skipped
    return found


async def test_a_served_placement_is_recorded_as_the_model_saw_it_with_its_outcome(
    client: Any, tmp_path: Path
) -> None:
    created = datetime.now(UTC) - timedelta(seconds=30)
    obj = pod("uid-7", created)
    node = await place(client, obj)
    assert node is not None
    recorder = client.app[RECORDER]
    assert records(tmp_path / "history.db") == []  # nothing written on the request path
    await ready(client, obj, created, bound_after=0.5, ready_after=3.5)
    before = metric("kdrl.decisions.recorded", kdrl_outcome="written")
    (served,) = recorder._served  # what the extender scored, before it is written
    assert recorder.flush() == 1
    assert metric("kdrl.decisions.recorded", kdrl_outcome="written") == before + 1
    (record,) = records(tmp_path / "history.db")
    loaded = client.app[EXTENDER].loaded
    assert (record.uid, record.function, record.policy, record.model) == (
        "uid-7",
        "shop/hello",
        "onnx",
        loaded.model,
    )
    assert record.feature_schema == features.SCHEMA_HASH and record.names[record.chosen] == node
    assert record.start_s == pytest.approx(3.5, abs=1e-3) and record.scheduling_s == pytest.approx(
        0.5, abs=1e-3
    )
    assert record.priority.value == "normal" and record.sla_met is True  # 3.5 s within normal's 5 s
    # The rows are what the model scored: its logits from them (plus, for a residual model, its
    # heuristic base on the candidates) are the recorded probabilities'.
    feasible = np.flatnonzero(record.mask)
    base = loaded.policy.base
    shift = (
        0.0 if base is None else base.logits(served.pod, served.candidates.take(feasible)).astype(np.float32)
    )
    (logits,) = loaded.policy.session.run(
        ["logits"],
        {
            "nodes": record.observation.nodes[feasible],
            "pod": record.observation.pod,
            "cluster": record.observation.cluster,
        },
    )
    assert record.probabilities is not None
    logits = logits + shift
    expected = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    np.testing.assert_allclose(record.probabilities[feasible], expected, rtol=1e-5)
    assert record.probabilities.sum() == pytest.approx(1.0, abs=1e-5)


def a_record(uid: str, at: float, schema: str = features.SCHEMA_HASH) -> Record:
    nodes = NodeTable.from_nodes(
        [Node(name=f"n{i}", cpu_allocatable=4000, memory_allocatable=8 << 30) for i in range(3)]
    )
    request = PodRequest(namespace="shop", name=uid, uid=uid, cpu_milli=250, memory_bytes=256 << 20)
    mask = np.array([True, False, True])
    return Record(
        uid=uid,
        at=at,
        function="shop/hello",
        priority=Priority.HIGH,
        policy="tuned",
        model="abc",
        feature_schema=schema,
        node="n2",
        chosen=2,
        names=["n0", "n1", "n2"],
        observation=features.encode(request, nodes, mask),
        mask=mask,
    )


def test_records_are_bounded_by_age_and_count_and_meet_outcomes_in_any_order(tmp_path: Path) -> None:
    store = DecisionStore(tmp_path / "h.db")
    store.observe([("early", 10.0, 2.5, 0.5, 2.0)])  # the pod's event came before the decision's flush
    store.write([a_record(f"d{i}", at=100.0 + i) for i in range(10)] + [a_record("early", 50.0)])
    skipped: Counter[str] = Counter()
    found = {r.uid: r for r in store.read(skipped)}
    assert found["early"].start_s == 2.5 and found["early"].sla_met is False  # high: 2 s
    assert found["d0"].start_s is None and found["d0"].sla_met is None
    # 60 s of retention at t=165 drops early (50) and d0..d4 (100..104); then 3 rows at most.
    assert store.trim(now=165.0, retention_s=60.0, max_rows=3) == 8
    assert [r.uid for r in store.read(skipped)] == ["d7", "d8", "d9"]
    np.testing.assert_array_equal(found["d3"].mask, [True, False, True])


def test_rows_of_another_feature_schema_or_undecodable_are_counted_not_returned(tmp_path: Path) -> None:
    store = DecisionStore(tmp_path / "h.db")
    store.write([a_record("old", 1.0, schema="0" * 16), a_record("good", 2.0), a_record("bad", 3.0)])
    store._db.execute("UPDATE decisions SET features = x'00' WHERE uid = 'bad'")
    skipped: Counter[str] = Counter()
    assert [r.uid for r in store.read(skipped)] == ["good"]
    assert skipped == {"another feature schema": 1, "undecodable row": 1}


async def test_recording_waits_off_the_request_path_and_drops_beyond_its_rate(client: Any) -> None:
    client.app[RECORDER].max_per_flush = 1
    created = datetime.now(UTC)
    before = metric("kdrl.decisions.recorded", kdrl_outcome="over_rate")
    for uid in ("a", "b"):
        await place(client, pod(uid, created))
    assert metric("kdrl.decisions.recorded", kdrl_outcome="over_rate") == before + 1
    assert client.app[RECORDER].flush() == 1


async def test_recording_can_be_turned_off(
    aiohttp_client: Any, tmp_path: Path, small_cluster: tuple[list[dict[str, Any]], list[dict[str, Any]]]
) -> None:
    nodes, _ = small_cluster
    settings = Settings(
        kube=KubeSettings(nodes_file=write_objects(tmp_path, "nodes.json", nodes)),
        history=HistorySettings(path=tmp_path / "history.db", record_decisions=False),
    )
    off = await aiohttp_client(await service.create_app(settings))
    assert RECORDER not in off.app and off.app[EXTENDER].on_bound is None


async def test_drain_waits_for_a_flush_under_way(client: Any, tmp_path: Path) -> None:
    """A periodic flush that has taken its rows and not yet written them: `flush` alone would
    find nothing left to write and miss them; `drain` writes them all."""
    created = datetime.now(UTC) - timedelta(seconds=30)
    for i in range(3):
        assert await place(client, pod(f"uid-d{i}", created)) is not None
    recorder = client.app[RECORDER]
    assert len(recorder._served) == 3
    under_way = asyncio.create_task(recorder.flush_soon())
    await asyncio.sleep(0)  # it takes the three rows, then lets the loop go between them
    assert recorder._served == [] and not under_way.done()
    assert recorder.flush() == 0 and records(tmp_path / "history.db") == []  # what flush alone sees
    assert await recorder.drain() == 0
    assert under_way.done() and len(records(tmp_path / "history.db")) == 3


async def test_a_flush_cancelled_at_shutdown_leaves_its_rows_to_the_final_flush(
    client: Any, tmp_path: Path
) -> None:
    created = datetime.now(UTC) - timedelta(seconds=30)
    for i in range(3):
        assert await place(client, pod(f"uid-c{i}", created)) is not None
    recorder = client.app[RECORDER]
    under_way = asyncio.create_task(recorder.flush_soon())
    await asyncio.sleep(0)  # the three rows taken, the first one encoded
    under_way.cancel()
    with pytest.raises(asyncio.CancelledError):
        await under_way
    assert recorder.flush() == 3 and len(records(tmp_path / "history.db")) == 3


async def test_shutdown_closes_the_store_only_after_a_write_still_on_its_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while its flush trims on the recorder's thread, `run` must not close the
    connection under that trim (it crashed the interpreter: SQLite freed under a running query)."""
    recorder = DecisionRecorder(
        tmp_path / "history.db", retention_s=3600.0, max_rows=100, max_per_s=10.0, flush_s=0.01
    )
    order: list[str] = []
    trimming, release = threading.Event(), threading.Event()
    trim, close = recorder.store.trim, recorder.store.close

    def slow_trim(**limits: float) -> int:
        order.append("trim begins")
        trimming.set()
        release.wait(10)
        deleted = trim(**limits)  # type: ignore[arg-type]
        order.append("trim ends")
        return deleted

    def closing() -> None:
        order.append("close")
        close()

    monkeypatch.setattr(recorder.store, "trim", slow_trim)
    monkeypatch.setattr(recorder.store, "close", closing)
    running = asyncio.create_task(recorder.run())
    assert await asyncio.to_thread(trimming.wait, 10)  # the first flush trims, on the thread
    running.cancel()
    threading.Timer(0.2, release.set).start()  # the trim ends while the shutdown waits
    with pytest.raises(asyncio.CancelledError):
        await running
    assert order == ["trim begins", "trim ends", "close"]
