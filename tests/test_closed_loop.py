"""The closed loop end to end: placements served through the real extender are recorded with
their start delays, `kdrl train --from-decisions` fine-tunes the serving model on them, `kdrl
evaluate --against` gates the result, the service reloads what ships, `kdrl rollback` undoes it.
And the learner's bad inputs: a decisions database missing, corrupt, empty or of another schema."""

from __future__ import annotations

import asyncio
import base64
import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench import synthetic
from plugin import app as service
from plugin import cli, learning_cli
from plugin.keys import EXTENDER, RECORDER, RELOADER
from plugin.settings import HistorySettings, KubeSettings, PolicySettings, Settings
from policies import onnx_policy
from policies.decision_records import DecisionStore
from tests.conftest import write_objects
from tests.test_decision_records import a_record, place, ready
from tests.test_model_reload import another_model

PODS = 40


def cached(node: dict[str, Any], image: str) -> bool:
    return any(image in entry["names"] for entry in node["status"].get("images", []))


@pytest.fixture
async def serving(aiohttp_client: Any, tmp_path: Path) -> tuple[Any, Path, list[dict[str, Any]]]:
    nodes, pods = synthetic.cluster(12, seed=3)
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


async def serve_a_day(client: Any, nodes: list[dict[str, Any]]) -> None:
    """Pods placed through filter, prioritize and bind; each Ready after 1 s, plus 6 s where its
    image had to be pulled: the outcome a placement decides."""
    by_name = {n["metadata"]["name"]: n for n in nodes}
    names = list(by_name)
    created = datetime.now(UTC) - timedelta(minutes=5)
    for i in range(PODS):
        image = synthetic.image_ref(i % 6)
        obj = synthetic.knative_pod(
            f"fn{i % 5}-{i}",
            service=f"fn{i % 5}",
            namespace="shop",
            uid=f"u{i}",
            image=image,
            priority=("critical", "high", "normal")[i % 3],
        )
        obj["metadata"]["creationTimestamp"] = created.isoformat()
        node = await place(client, obj, names)
        start = 1.0 + (0.0 if cached(by_name[node], image) else 6.0)
        await ready(client, obj, created, bound_after=0.2, ready_after=start)


async def test_record_learn_gate_reload_and_roll_back(
    serving: tuple[Any, Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    client, model, nodes = serving
    await serve_a_day(client, nodes)
    assert client.app[RECORDER].flush() == PODS
    database = tmp_path / "history.db"
    store = DecisionStore(database)  # two rows the learner must skip, never train on
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
    assert report["used"] == PODS and report["with_probabilities"] == PODS
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
    client.app[RECORDER].flush()
    argv = ["loop", "--decisions", str(tmp_path / "history.db"), "--if-sla-violations-above", "100"]
    argv += ["--work", str(tmp_path / "loop")]
    assert await asyncio.to_thread(cli.main, argv) == 0
    outcome = json.loads((tmp_path / "loop" / "loop.json").read_text())
    assert outcome["result"].startswith("skipped") and 0 < outcome["sla_violation_pct"] < 100
    assert not (tmp_path / "loop" / "new").exists()
