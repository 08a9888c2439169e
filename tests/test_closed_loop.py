"""The closed loop end to end: placements served through the real extender are recorded with
their start delays, `kdrl train --from-decisions` fine-tunes the serving model on them, `kdrl
evaluate --against` gates the result, the service reloads what ships, `kdrl rollback` undoes it.
And the learner's bad inputs: a decisions database missing, corrupt, empty or of another schema."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import shutil
import zlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench import synthetic
from plugin import app as service
from plugin import cli, learning_cli, loop_cli
from plugin.keys import EXTENDER, RECORDER, RELOADER
from plugin.settings import HistorySettings, KubeSettings, PolicySettings, Settings
from policies import heuristics, onnx_policy
from policies.decision_records import DecisionStore
from simulator import clusterspec, compare, engine, keepalive, traces, workload
from tests.conftest import write_objects
from tests.test_decision_records import a_record, place, ready
from tests.test_model_reload import another_model


def cached(node: dict[str, Any], image: str) -> bool:
    return any(image in entry["names"] for entry in node["status"].get("images", []))


@pytest.fixture
async def serving(aiohttp_client: Any, tmp_path: Path) -> tuple[Any, Path, list[dict[str, Any]]]:
    nodes, pods = synthetic.cluster(30, seed=3)  # room for a day of pods that never leave
    model = tmp_path / "serving" / "placement.onnx"
    model.parent.mkdir()
    shutil.copy(onnx_policy.DEFAULT_MODEL, model)
    settings = Settings(
        kube=KubeSettings(
            nodes_file=write_objects(tmp_path, "nodes.json", nodes),
            pods_file=write_objects(tmp_path, "pods.json", pods),
        ),
        history=HistorySettings(path=tmp_path / "history.db", decisions_max_per_s=1000),
        policy=PolicySettings(name="onnx", model=model, device="cpu", reload_s=0),
    )
    return await aiohttp_client(await service.create_app(settings)), model, nodes


@functools.cache
def simulated_day() -> tuple[tuple[str, str, str], ...]:
    """The pods a simulated day asks for, in order: 30 functions of the bundled slice on
    `small`, 24 hours (function, image, priority of each placement the simulator made)."""
    options = compare.Options(functions=30, weighted=True, seed=1, cluster="small")
    trace = compare.select(traces.load(compare.BUNDLED_TRACE), options)
    simulation = engine.Simulation(
        workload=workload.build(trace, seed=1),
        counts=trace.counts,
        cluster=clusterspec.load("small"),
        placement=heuristics.kube_default(),
        keepalive=keepalive.by_name("knative"),
        seed=1,
    )
    pods = []
    steps = simulation.steps()
    with contextlib.suppress(StopIteration):
        decision = next(steps)
        while True:
            pod = decision.pod
            pods.append((pod.function or "", pod.images[0], pod.priority.value))
            decision = steps.send(engine.best_row(heuristics.kube_default(), decision))
    return tuple(pods)


async def serve_a_day(client: Any, nodes: list[dict[str, Any]]) -> int:
    """A simulated day's pods placed through filter, prioritize and bind, each Ready after 1 s,
    plus 6 s where the node lacked its image: the outcome a placement decides. Their functions,
    images (each function's mapped onto one the synthetic nodes cache) and priorities are the
    simulator's; their requests are small, since the offline cluster never sees a pod leave.
    Returns the placements bound."""
    by_name = {n["metadata"]["name"]: n for n in nodes}
    names = list(by_name)
    created = datetime.now(UTC) - timedelta(minutes=5)
    day, bound = simulated_day(), 0
    for i, (function, image, priority) in enumerate(day):
        namespace, _, service_name = function.partition("/")
        mapped = synthetic.image_ref(zlib.crc32(image.encode()) % 120)
        obj = synthetic.knative_pod(
            f"{service_name}-{i}",
            service=service_name,
            namespace=namespace,
            uid=f"u{i}",
            image=mapped,
            cpu="20m",
            memory="32Mi",
            priority=priority,
        )
        obj["metadata"]["creationTimestamp"] = created.isoformat()
        node = await place(client, obj, names)
        if node is None:
            continue
        bound += 1
        start = 1.0 + (0.0 if cached(by_name[node], mapped) else 6.0)
        await ready(client, obj, created, bound_after=0.2, ready_after=start)
    return bound


async def test_record_learn_gate_reload_and_roll_back(
    serving: tuple[Any, Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    client, model, nodes = serving
    pods = await serve_a_day(client, nodes)
    assert pods > 500  # a day's placements
    await client.app[RECORDER].drain()  # what waits beyond the last periodic flush, and one under way
    database = tmp_path / "history.db"
    store = DecisionStore(database)
    assert len(store) == pods  # every bound placement, once
    # Two rows the learner must skip, never train on.
    unknown = a_record("bad-node", 1.0)
    broken = a_record("nan", 2.0)
    broken.observation.nodes[0, 0] = np.nan
    store.write([unknown.__class__(**{**unknown.__dict__, "chosen": -1}), broken])
    store.observe([("bad-node", 3.0, 2.0, None, None), ("nan", 3.0, 2.0, None, None)])
    store.close()

    new = tmp_path / "new"
    assert (
        cli.main(["train", "--from-decisions", str(database), "--from-model", str(model), "--out", str(new)])
        == 0
    )
    report = json.loads((new / "report.json").read_text())
    assert report["used"] == pods and report["with_probabilities"] == pods
    assert report["skipped"] == {"unknown node": 1, "features not finite": 1}
    assert report["kl_to_start"] > 0  # it moved, and (the KL term) not far
    candidate = new / "placement.onnx"
    assert onnx_policy.load(candidate, device="cpu").model  # a model that serves

    serving_hash = client.app[EXTENDER].loaded.model
    gate_argv = ["evaluate", "--model", str(candidate), "--against", str(model), "--ship", str(model)]
    gate_argv += ["--cluster", "small", "--shifted", "", "--seeds", "2", "--functions", "6"]
    gate_argv += ["--workers", "2", "--out", str(tmp_path / "gate")]
    verdict_code = cli.main(gate_argv)
    verdict = json.loads((tmp_path / "gate" / "gate.json").read_text())
    assert verdict_code == (0 if verdict["ship"] else 1)
    assert set(verdict["checks"]) == {"composite", "sla_violation_pct_critical", "sla_violation_pct_high"}
    assert verdict["drain_underused"] is True  # judged on the evaluation's ground
    if verdict["ship"]:
        assert onnx_policy.content_hash(model.read_bytes()) == onnx_policy.content_hash(
            candidate.read_bytes()
        )
    else:  # refused: the serving file is untouched; ship it anyway to go on with reload and rollback
        assert onnx_policy.content_hash(model.read_bytes()) == serving_hash
        learning_cli.ship(candidate, model)
    assert await client.app[RELOADER].check(forced=True)
    new_hash = client.app[EXTENDER].loaded.model
    assert new_hash == onnx_policy.content_hash(candidate.read_bytes()) != serving_hash
    assert (await (await client.get("/readyz")).json())["model"] == new_hash

    assert cli.main(["rollback", str(model)]) == 0
    assert await client.app[RELOADER].check(forced=True)
    assert client.app[EXTENDER].loaded.model == serving_hash


@pytest.mark.parametrize("problem", ["missing", "corrupt", "empty", "another schema"])
def test_a_decisions_database_that_cannot_teach_stops_with_exit_2(
    tmp_path: Path, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    database = tmp_path / "history.db"
    if problem == "corrupt":
        database.write_bytes(b"SQLite format 3\x00" + b"\xff" * 400)
    elif problem == "empty":
        DecisionStore(database).close()
    elif problem == "another schema":
        store = DecisionStore(database)
        store.write([a_record("old", 1.0, schema="0" * 16)])
        store.close()
    argv = ["train", "--from-decisions", str(database), "--out", str(tmp_path / "out")]
    assert cli.main(argv) == 2
    said = capsys.readouterr().err
    expected = {
        "missing": "no such decisions database",
        "corrupt": "not a decisions database",
        "empty": "none recorded",
        "another schema": "of another feature schema",
    }[problem]
    assert expected in said
    assert not (tmp_path / "out" / "placement.onnx").exists()


def test_ship_keeps_the_previous_model_and_rollback_needs_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "placement.onnx"
    assert cli.main(["rollback", str(path)]) == 2
    assert "no previous model" in capsys.readouterr().err
    shutil.copy(onnx_policy.DEFAULT_MODEL, path)
    new = another_model(tmp_path / "other.onnx", "shipped")
    learning_cli.ship(tmp_path / "other.onnx", path)
    assert onnx_policy.content_hash(path.read_bytes()) == new
    assert (tmp_path / "placement.onnx.previous").read_bytes() == onnx_policy.DEFAULT_MODEL.read_bytes()
    assert not (tmp_path / "placement.onnx.incoming").exists()
    assert cli.main(["rollback", str(path)]) == 0
    assert path.read_bytes() == onnx_policy.DEFAULT_MODEL.read_bytes()
    assert onnx_policy.content_hash((tmp_path / "placement.onnx.rolled-back").read_bytes()) == new


async def test_kdrl_loop_fetches_learns_gates_publishes_and_rolls_back_the_configmap(
    serving: tuple[Any, Path, list[dict[str, Any]]], tmp_path: Path, fake_kube: tuple[Any, str]
) -> None:
    client, _, nodes = serving
    fake, url = fake_kube
    shipped = onnx_policy.DEFAULT_MODEL.read_bytes()
    await fake.add(
        "configmaps",
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "kdrl-model", "namespace": "kdrl-system"},
            "binaryData": {"placement.onnx": base64.b64encode(shipped).decode()},
        },
    )
    await serve_a_day(client, nodes)
    admin = str(client.make_url("")).rstrip("/")
    argv = ["loop", "--decisions", admin, "--kube-api-url", url, "--work", str(tmp_path / "loop")]
    argv += ["--cluster", "small", "--seeds", "2", "--functions", "6", "--workers", "2"]
    assert await asyncio.to_thread(cli.main, argv) == 0  # the admin port answers on this loop
    outcome = json.loads((tmp_path / "loop" / "loop.json").read_text())
    stored = fake.objects["configmaps"]["kdrl-system/kdrl-model"]["binaryData"]
    new = (tmp_path / "loop" / "new" / "placement.onnx").read_bytes()
    if outcome["gate"]["ship"]:
        assert outcome["result"].startswith("published")
        assert base64.b64decode(stored["placement.onnx"]) == new
        assert base64.b64decode(stored["placement.onnx.previous"]) == shipped
        rollback = ["rollback", "--configmap", "kdrl-system/kdrl-model", "--kube-api-url", url]
        assert await asyncio.to_thread(cli.main, rollback) == 0
        stored = fake.objects["configmaps"]["kdrl-system/kdrl-model"]["binaryData"]
        assert base64.b64decode(stored["placement.onnx"]) == shipped
        assert base64.b64decode(stored["placement.onnx.previous"]) == new
    else:
        assert outcome["result"].startswith("refused")
        assert (
            base64.b64decode(stored["placement.onnx"]) == shipped and "placement.onnx.previous" not in stored
        )


async def test_kdrl_loop_does_nothing_while_slas_hold(
    serving: tuple[Any, Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    client, _, nodes = serving
    await serve_a_day(client, nodes)
    await client.app[RECORDER].drain()
    argv = ["loop", "--decisions", str(tmp_path / "history.db"), "--if-sla-violations-above", "100"]
    argv += ["--work", str(tmp_path / "loop")]
    assert await asyncio.to_thread(cli.main, argv) == 0
    outcome = json.loads((tmp_path / "loop" / "loop.json").read_text())
    assert outcome["result"].startswith("skipped") and 0 <= outcome["sla_violation_pct"] <= 100
    assert not (tmp_path / "loop" / "new").exists()


def test_the_sla_trigger_counts_the_recorded_pods_that_missed_their_class_target(tmp_path: Path) -> None:
    store = DecisionStore(tmp_path / "h.db")  # high priority: a 2 s target
    store.write([a_record(f"p{i}", at=1000.0 + i) for i in range(4)] + [a_record("old", at=10.0)])
    store.observe([("p0", 0.0, 1.5, None, None), ("p1", 0.0, 3.0, None, None), ("p2", 0.0, 2.0, None, None)])
    store.observe([("old", 0.0, 9.0, None, None)])  # before `since`: not counted; p3: never Ready
    store.close()
    assert loop_cli.sla_violation_pct(tmp_path / "h.db", since=500.0) == pytest.approx(100 / 3, abs=1e-3)
    assert loop_cli.sla_violation_pct(tmp_path / "h.db", since=5000.0) is None
