"""A model file that changes on disk serves without a restart; one that fails to load does not
replace the serving model (`plugin/model_reload.py`)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import onnx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench import synthetic
from plugin import app as service
from plugin.keys import EXTENDER, RELOADER
from plugin.settings import HistorySettings, KubeSettings, PolicySettings, Settings
from policies import onnx_policy
from tests.conftest import metric, write_objects
from tests.test_extender_http import pending, post


def another_model(path: Path, note: str) -> str:
    """The shipped model with one more metadata entry: as valid, other bytes; returns its hash."""
    graph = onnx.load(str(onnx_policy.DEFAULT_MODEL))
    props = {p.key: p.value for p in graph.metadata_props} | {"kdrl.note": note}
    onnx.helper.set_model_props(graph, props)
    onnx.save(graph, str(path))
    return onnx_policy.content_hash(path.read_bytes())


@pytest.fixture
async def served(
    aiohttp_client: Any, tmp_path: Path, small_cluster: tuple[list[dict[str, Any]], list[dict[str, Any]]]
) -> tuple[Any, Path]:
    nodes, _ = small_cluster
    model = tmp_path / "placement.onnx"
    shutil.copy(onnx_policy.DEFAULT_MODEL, model)
    settings = Settings(
        kube=KubeSettings(nodes_file=write_objects(tmp_path, "nodes.json", nodes)),
        history=HistorySettings(path=tmp_path / "history.db"),
        policy=PolicySettings(name="onnx", model=model, device="cpu", reload_s=0),  # SIGHUP or check()
    )
    return await aiohttp_client(await service.create_app(settings)), model


async def readyz(client: Any) -> dict[str, Any]:
    detail: dict[str, Any] = await (await client.get("/readyz")).json()
    return detail


async def test_a_changed_model_serves_from_the_next_call_and_names_its_hash(
    served: tuple[Any, Path], tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    client, model = served
    shipped = onnx_policy.content_hash(onnx_policy.DEFAULT_MODEL.read_bytes())
    assert (await readyz(client))["model"] == shipped
    new = another_model(tmp_path / "new.onnx", "retrained")
    os.replace(tmp_path / "new.onnx", model)  # as a deployment swaps a file: atomically
    before = metric("kdrl.model.reloads", kdrl_outcome="reloaded")
    assert await client.app[RELOADER].check()
    detail = await readyz(client)
    assert detail["model"] == new != shipped and detail["model_reload"]["error"] == ""
    assert metric("kdrl.model.reloads", kdrl_outcome="reloaded") == before + 1
    body = {"Pod": pending(image=synthetic.image_ref(1)), "NodeNames": ["roomy", "full", "gpu"]}
    status, _ = await post(client, "prioritize", body)
    assert status == 200
    (span,) = [s for s in spans.get_finished_spans() if s.name == "kdrl.extender.prioritize"]
    assert (span.attributes or {})["kdrl.policy.model"] == new
    assert not await client.app[RELOADER].check()  # unchanged since: nothing to do


@pytest.mark.parametrize("broken", ["corrupt", "missing", "another schema"])
async def test_a_model_that_fails_to_load_leaves_the_serving_one_and_says_why(
    served: tuple[Any, Path], broken: str
) -> None:
    client, model = served
    serving = client.app[EXTENDER].loaded
    if broken == "corrupt":
        model.write_bytes(b"\x08\x07not a model")
    elif broken == "missing":
        model.unlink()
    else:
        graph = onnx.load(str(model))
        props = {p.key: p.value for p in graph.metadata_props} | {onnx_policy.META_SCHEMA: "0" * 16}
        onnx.helper.set_model_props(graph, props)
        onnx.save(graph, str(model))
    before = metric("kdrl.model.reloads", kdrl_outcome="failed")
    assert not await client.app[RELOADER].check()
    assert client.app[EXTENDER].loaded is serving
    detail = await readyz(client)
    assert detail["policy"] == "onnx" and detail["degraded"] == "" and detail["model"] == serving.model
    assert str(model) in detail["model_reload"]["error"]
    assert metric("kdrl.model.reloads", kdrl_outcome="failed") == before + 1
    shutil.copy(onnx_policy.DEFAULT_MODEL, model)  # a good file again: the error clears
    assert not await client.app[RELOADER].check()  # the same model as serves: no swap
    assert (await readyz(client))["model_reload"]["error"] == ""


async def test_sighup_reloads_at_once(served: tuple[Any, Path], tmp_path: Path) -> None:
    client, model = served
    new = another_model(tmp_path / "new.onnx", "sighup")
    stamp = model.stat()
    os.replace(tmp_path / "new.onnx", model)
    os.utime(model, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # a stamp that would not tell
    os.kill(os.getpid(), signal.SIGHUP)
    for _ in range(100):
        if (await readyz(client))["model"] == new:
            break
        await asyncio.sleep(0.05)
    assert (await readyz(client))["model"] == new
