"""The service's prewarm cycle against the fake API server: plan, lead, apply, undo."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import tempfile
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from forecaster import phase
from forecaster.forecasting import Forecast
from forecaster.history import HistoryStore
from plugin import app as service
from plugin.emitter import Emitter
from plugin.errors import KubeApiError
from plugin.functions import FunctionCatalog, function_state
from plugin.prewarm_loop import PrewarmLoop
from plugin.prewarming import Prepuller, RevisionActuator
from plugin.settings import HistorySettings, KubeSettings, PrewarmSettings, Settings
from policies import heuristics
from policies.types import Node, NodeTable, Priority
from prewarm import actuation as act
from prewarm import rfc3339
from prewarm.planning import Budget
from tests.conftest import api_client, metric
from tests.fakekube import FakeKube

GiB = 1 << 30
IMAGE = "registry.example.com/shop/hello@sha256:abc"
NOW = 1_800_000_000.0  # a fixed clock


def knative_service(**annotations: str) -> dict[str, Any]:
    return {
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "metadata": {"name": "hello", "namespace": "shop"},
        "spec": {
            "template": {
                "metadata": {"annotations": {"kdrl.dev/priority": "high", **annotations}},
                "spec": {
                    "containerConcurrency": 10,
                    "containers": [
                        {"image": IMAGE, "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}}}
                    ],
                },
            }
        },
        "status": {"traffic": [{"revisionName": "hello-00002", "percent": 100}]},
    }


def likely(function: str = "shop/hello") -> Forecast:
    horizon = 30
    return Forecast(
        function=function,
        start_minute=int(NOW // 60),
        expected=np.full(horizon, 2.0),
        p_invoked=np.full(horizon, 0.9),
        p_within=np.full(horizon, 0.95),
        prewarm_minutes=0.0,
        keepalive_minutes=10.0,
        model="SeasonalNaive60",
        relative_mae=None,
        elapsed_minutes=1,  # just invoked: the hybrid histogram would hold it too
    )


NODES = NodeTable.from_nodes([Node(name="node-a", cpu_allocatable=4000, memory_allocatable=16 * GiB)])


@pytest.fixture
async def setup(fake_kube: tuple[FakeKube, str]) -> AsyncIterator[tuple[FakeKube, dict[str, Any]]]:
    fake, url = fake_kube
    await fake.add("services", knative_service())
    await fake.add(
        "revisions",
        {"metadata": {"name": "hello-00002", "namespace": "shop", "annotations": {"team": "shop"}}},
    )
    api = api_client(url)
    state: dict[str, Any] = {"forecasts": {"shop/hello": likely()}, "leading": True}
    yield fake, {"api": api, "state": state}
    await api.close()


def loop(env: dict[str, Any], *, shadow: bool = False) -> PrewarmLoop:
    api, state = env["api"], env["state"]
    catalog = FunctionCatalog()
    catalog.services.replace([knative_service()])
    return PrewarmLoop(
        catalog=catalog,
        forecasts=lambda: state["forecasts"],
        nodes=lambda: NODES,
        policy=heuristics.kube_default,
        actuator=RevisionActuator(api, timeout_s=2.0, shadow=shadow),
        prepuller=Prepuller(api, namespace="kdrl-system", timeout_s=2.0, shadow=shadow),
        budget=Budget(warm_memory_bytes=8 * GiB, pulls_per_minute=5),
        leading=lambda: state["leading"],
        clock=lambda: NOW,
        interval_s=0.01,
    )


def test_an_unknown_prewarm_value_is_logged_once_and_read_as_allowed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    odd = knative_service(**{"kdrl.dev/prewarm": "maybe"})
    with caplog.at_level(logging.WARNING, logger="plugin.functions"):
        first, again = function_state(odd), function_state(odd)
    assert first is not None and again is not None and first.prewarm_allowed and again.prewarm_allowed
    warnings = [r for r in caplog.records if "kdrl.dev/prewarm" in r.getMessage()]
    assert len(warnings) == 1 and "'maybe'" in warnings[0].getMessage()
    for value, allowed in (("False", False), (" TRUE ", True)):
        state = function_state(knative_service(**{"kdrl.dev/prewarm": value}))
        assert state is not None and state.prewarm_allowed is allowed


def min_scale(fake: FakeKube) -> str | None:
    return fake.objects["revisions"]["shop/hello-00002"]["metadata"]["annotations"].get(act.MIN_SCALE)


def test_a_knative_service_becomes_the_planners_function_state() -> None:
    state = function_state(knative_service(), observed_cold_starts_s=[3.0, 4.0, 9.0])
    assert state is not None
    assert (state.function, state.priority, state.memory_bytes) == ("shop/hello", Priority.HIGH, 512 << 20)
    assert state.cold_start_s == 4.0
    assert state.pod.images == (IMAGE,) and state.prewarm_allowed
    opted_out = function_state(knative_service(**{"kdrl.dev/prewarm": "false", act.MIN_SCALE: "2"}))
    assert opted_out is not None and not opted_out.prewarm_allowed and opted_out.author_min_scale == 2
    assert state.max_scale == 0  # no max-scale: no limit
    capped = function_state(knative_service(**{"autoscaling.knative.dev/max-scale": "3"}))
    assert capped is not None and capped.max_scale == 3
    garbage = function_state(knative_service(**{"autoscaling.knative.dev/max-scale": "lots"}))
    assert garbage is not None and garbage.max_scale == 0
    assert function_state({"metadata": {}}) is None


async def test_the_leader_warms_pulls_and_restores_when_the_plan_lets_go(
    setup: tuple[FakeKube, dict[str, Any]],
) -> None:
    fake, env = setup
    cycle = loop(env)
    decided = await cycle.cycle()
    assert [w.function for w in decided.warm] == ["shop/hello"]
    assert min_scale(fake) == "1"  # the author set none: one warm replica
    pods = list(fake.objects["pods"].values())
    assert [p["spec"]["nodeName"] for p in pods] == ["node-a"]  # the image pre-pulled where it lands
    assert pods[0]["metadata"]["namespace"] == "kdrl-system"

    env["state"]["forecasts"] = {}  # nothing expected any more: the plan lets go
    await cycle.cycle()
    assert cycle.warmed == set()
    assert fake.objects["revisions"]["shop/hello-00002"]["metadata"]["annotations"] == {"team": "shop"}


async def test_followers_and_shadow_mode_plan_but_change_nothing(
    setup: tuple[FakeKube, dict[str, Any]],
) -> None:
    fake, env = setup
    env["state"]["leading"] = False
    follower = loop(env)
    assert (await follower.cycle()).warm and not fake.patches and not fake.objects["pods"]
    env["state"]["leading"] = True
    shadow = loop(env, shadow=True)
    assert (await shadow.cycle()).warm and not fake.patches and not fake.objects["pods"]


async def test_a_clean_shutdown_restores_unless_told_to_keep(setup: tuple[FakeKube, dict[str, Any]]) -> None:
    fake, env = setup
    kept = loop(env)
    await kept.cycle()
    await kept.shutdown(keep=True)
    assert min_scale(fake) == "1"
    restored = loop(env)
    await restored.cycle()
    await restored.shutdown(keep=False)
    assert min_scale(fake) is None


async def test_an_unreachable_api_server_backs_off_instead_of_spinning(
    setup: tuple[FakeKube, dict[str, Any]],
) -> None:
    fake, env = setup
    fake.outage = True
    cycle = loop(env)
    with pytest.raises(KubeApiError):
        await cycle.cycle()
    before = len(fake.requests)
    task = asyncio.create_task(cycle.run())
    await asyncio.sleep(0.5)
    task.cancel()
    # Back-off doubles from 10 ms up to 100 ms: a handful of tries in 0.5 s, not hundreds.
    assert 1 <= len(fake.requests) - before <= 15


def test_knative_image_cache_objects_resolve_the_routed_revisions_images() -> None:
    digest = "registry.example.com/shop/hello@sha256:0123"
    catalog = FunctionCatalog()
    catalog.services.replace([knative_service()])
    catalog.images.replace(
        [
            {
                "metadata": {"name": "hello-00002-cache-user-container", "namespace": "shop"},
                "spec": {"image": digest},
            },
            {
                "metadata": {"name": "hello-00001-cache-user-container", "namespace": "shop"},
                "spec": {"image": "old"},
            },
        ]
    )
    assert catalog.states()["shop/hello"].pod.images == (digest,)  # the routed revision's, by digest
    catalog.images.apply(
        "DELETED", {"metadata": {"name": "hello-00002-cache-user-container", "namespace": "shop"}}
    )
    assert catalog.states()["shop/hello"].pod.images == (IMAGE,)  # not cached: the template's


async def test_each_applied_change_is_a_cloudevent_to_k_sink(setup: tuple[FakeKube, dict[str, Any]]) -> None:
    types: list[str] = []

    async def sink(request: web.Request) -> web.Response:
        types.append(request.headers["ce-type"])
        return web.Response(status=202)

    sink_app = web.Application()
    sink_app.router.add_post("/", sink)
    _, env = setup
    async with TestServer(sink_app) as server:
        cycle = loop(env)
        cycle.emitter = Emitter(str(server.make_url("/")))
        await cycle.cycle()
        env["state"]["forecasts"] = {}
        await cycle.cycle()
        await cycle.shutdown(keep=False)
    assert types == ["dev.kdrl.prewarm.warm", "dev.kdrl.prewarm.prepull", "dev.kdrl.prewarm.restore"]


@pytest.mark.parametrize(("serving", "shadow"), [("1.22.0", False), ("1.20.3", True), (None, True)])
async def test_the_service_plans_leads_and_falls_back_to_shadow_on_old_serving(
    aiohttp_client: Any, fake_kube: tuple[FakeKube, str], serving: str | None, shadow: bool
) -> None:
    fake, url = fake_kube
    if serving is not None:
        labels = {"app.kubernetes.io/version": serving}
        await fake.add(
            "deployments",
            {"metadata": {"name": "controller", "namespace": "knative-serving", "labels": labels}},
        )
    settings = Settings(
        kube=KubeSettings(api_url=url, watch_timeout_s=1, backoff_max_s=0.2, request_timeout_s=2),
        history=HistorySettings(path=Path(tempfile.mkdtemp()) / "history.db"),
        prewarm=PrewarmSettings(identity="replica-a"),
    )
    client = await aiohttp_client(await service.create_app(settings))
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        answer = await (await client.get("/debug/prewarm")).json()
        if answer["plan"] is not None and answer["leader"]:
            break
        assert asyncio.get_running_loop().time() < deadline, answer
        await asyncio.sleep(0.05)
    assert answer["shadow"] is shadow
    assert fake.objects["leases"]["kdrl-system/kdrl-prewarm"]["spec"]["holderIdentity"] == "replica-a"


async def test_the_service_resumes_and_keeps_the_answer_losses_in_its_history(
    aiohttp_client: Any, fake_kube: tuple[FakeKube, str], tmp_path: Path
) -> None:
    _, url = fake_kube
    path = tmp_path / "history.db"
    before = HistoryStore(path)
    before.keep_answer_losses(phase.Judged(100, {"shop/hello": (2.0, 0.5)}))
    before.close()
    settings = Settings(
        kube=KubeSettings(api_url=url, watch_timeout_s=1, backoff_max_s=0.2, request_timeout_s=2),
        history=HistorySettings(path=path),
        prewarm=PrewarmSettings(identity="replica-a"),
    )
    client = await aiohttp_client(await service.create_app(settings))
    prewarm = client.server.app[service.PREWARM]
    deadline = asyncio.get_running_loop().time() + 10
    while prewarm.latest is None:
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.05)
    assert prewarm.scores.judged() == phase.Judged(100, {"shop/hello": (2.0, 0.5)})
    assert prewarm.keep_scores is not None
    await prewarm.keep_scores(phase.Judged(101, {"shop/hello": (1.0, 0.25)}))
    assert HistoryStore(path).answer_losses() == phase.Judged(101, {"shop/hello": (1.0, 0.25)})


async def test_the_plan_is_a_span_linked_to_its_forecast_and_each_change_a_child(
    setup: tuple[FakeKube, dict[str, Any]], spans: InMemorySpanExporter
) -> None:
    _, env = setup
    cycle = loop(env)
    with trace.get_tracer("test").start_as_current_span("kdrl.forecast") as forecast_span:
        forecast = forecast_span.get_span_context()
    cycle.forecast_context = lambda: forecast
    await cycle.cycle()
    finished = {s.name: s for s in spans.get_finished_spans()}
    planned = finished["kdrl.prewarm.plan"]
    assert [link.context.span_id for link in planned.links] == [forecast.span_id]
    assert planned.attributes is not None and planned.attributes["kdrl.prewarm.warm"] == 1
    (warm,) = [e for e in planned.events if e.name == "kdrl.prewarm.warm"]
    assert warm.attributes is not None and warm.attributes["kdrl.function"] == "shop/hello"
    assert warm.attributes["kdrl.prewarm.benefit_usd"] > warm.attributes["kdrl.prewarm.cost_usd"]
    for change in ("kdrl.prewarm.warm", "kdrl.prewarm.prepull"):
        assert finished[change].parent is not None
        assert finished[change].parent.span_id == planned.context.span_id


async def test_the_plan_takes_the_phase_answer_once_it_has_scored_better(
    setup: tuple[FakeKube, dict[str, Any]], spans: InMemorySpanExporter
) -> None:
    _, env = setup
    cycle = loop(env)
    start = int(NOW // 60)
    answers = []
    for minute in range(start, start + 6):  # invoked every minute: the phase answer (0.95) is right
        made = replace(
            likely(), start_minute=minute, p_within_idle=np.full(30, 0.3), p_within_phase=np.full(30, 0.95)
        )
        env["state"]["forecasts"] = {"shop/hello": made}
        (warm,) = (await cycle.cycle()).warm
        answers.append((warm.reason.answer, warm.reason.probability))
    # Judged from the fourth cycle on (the lookahead is three minutes), then taken.
    assert answers[:3] == [("idle", pytest.approx(0.3))] * 3
    assert answers[3:] == [("phase", pytest.approx(0.95))] * 3
    planned = [s for s in spans.get_finished_spans() if s.name == "kdrl.prewarm.plan"][-1]
    (event,) = [e for e in planned.events if e.name == "kdrl.prewarm.warm"]
    assert event.attributes is not None and event.attributes["kdrl.prewarm.answer"] == "phase"


async def test_a_restarted_service_takes_the_answer_it_had_earned(
    setup: tuple[FakeKube, dict[str, Any]], tmp_path: Path
) -> None:
    _, env = setup
    store = HistoryStore(tmp_path / "history.db")

    async def keep(judged: phase.Judged) -> None:
        store.keep_answer_losses(judged)

    def invoked_every_minute(minute: int) -> Forecast:
        made = replace(likely(), start_minute=minute)
        return replace(made, p_within_idle=np.full(30, 0.3), p_within_phase=np.full(30, 0.95))

    first = loop(env)
    first.keep_scores = keep
    start = int(NOW // 60)
    for minute in range(start, start + 6):
        env["state"]["forecasts"] = {"shop/hello": invoked_every_minute(minute)}
        assert (await first.cycle()).warm
    assert first.latest is not None and first.latest.warm[0].reason.answer == "phase"
    store.close()

    kept = HistoryStore(tmp_path / "history.db").answer_losses()  # the process restarts
    restarted, fresh = loop(env), loop(env)
    restarted.scores = phase.Scores.resumed(kept)
    env["state"]["forecasts"] = {"shop/hello": invoked_every_minute(start + 6)}
    (resumed,) = (await restarted.cycle()).warm
    (forgotten,) = (await fresh.cycle()).warm
    assert resumed.reason.answer == "phase"  # at once, not three minutes on
    assert forgotten.reason.answer == "idle"


async def test_a_store_that_fails_to_keep_the_scores_costs_a_warning_not_the_cycle(
    setup: tuple[FakeKube, dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    _, env = setup

    async def broken(judged: phase.Judged) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    cycle = loop(env)
    cycle.keep_scores = broken
    start = int(NOW // 60)
    for minute in range(start, start + 5):
        env["state"]["forecasts"] = {"shop/hello": replace(likely(), start_minute=minute)}
        assert (await cycle.cycle()).warm  # planned and applied all the same
    assert "could not keep the answer losses" in caplog.text


async def test_a_new_leader_restores_what_a_crashed_one_left_warm(
    setup: tuple[FakeKube, dict[str, Any]],
) -> None:
    fake, env = setup
    crashed = loop(env)
    await crashed.cycle()
    assert min_scale(fake) == "1"
    del crashed  # killed: no shutdown, its memory of what it warmed is gone
    env["state"]["forecasts"] = {}  # the window is over: nothing holds the function any more
    successor = loop(env)
    assert successor.warmed == set()
    await successor.cycle()
    assert fake.objects["revisions"]["shop/hello-00002"]["metadata"]["annotations"] == {"team": "shop"}


async def test_a_held_window_is_renewed_only_when_it_would_lapse(
    setup: tuple[FakeKube, dict[str, Any]],
) -> None:
    fake, env = setup
    cycle = loop(env)
    await cycle.cycle()
    patches, events = len(fake.patches), len(fake.objects["events"])
    assert patches == 1 and events == 1
    for _ in range(3):  # the next minutes' plans hold it again, the window still far from its end
        await cycle.cycle()
    assert len(fake.patches) == patches and len(fake.objects["events"]) == events
    annotations = fake.objects["revisions"]["shop/hello-00002"]["metadata"]["annotations"]
    annotations[act.UNTIL] = rfc3339.render(
        datetime.fromtimestamp(NOW, UTC) + timedelta(minutes=1)
    )  # about to lapse
    await cycle.cycle()
    assert len(fake.patches) == patches + 1  # renewed ...
    assert len(fake.objects["events"]) == events  # ... without a new Event: nothing changed for SREs


async def test_shadow_mode_reports_nothing_as_warmed(setup: tuple[FakeKube, dict[str, Any]]) -> None:
    _, env = setup
    shadow = loop(env, shadow=True)
    assert (await shadow.cycle()).warm and shadow.warmed == set()


async def test_warm_windows_are_judged_hits_or_misses_and_changes_counted(
    setup: tuple[FakeKube, dict[str, Any]],
) -> None:
    _, env = setup
    invoked = {"shop/hello": False}
    before = {r: metric("kdrl.prewarm.windows", kdrl_result=r) for r in ("hit", "miss")}
    applied = metric("kdrl.prewarm.changes", kdrl_action="warm", kdrl_result="applied")
    cycle = loop(env)
    cycle.invoked = lambda function, minute: invoked[function]
    await cycle.cycle()  # warmed, not yet invoked
    assert metric("kdrl.prewarm.changes", kdrl_action="warm", kdrl_result="applied") == applied + 1
    assert metric("kdrl.prewarm.replicas", kdrl_mode="applied") == 1
    assert metric("kdrl.prewarm.memory", kdrl_mode="applied") == 512 << 20
    invoked["shop/hello"] = True
    await cycle.cycle()  # invoked while held: a hit, counted once
    await cycle.cycle()
    env["state"]["forecasts"] = {}
    await cycle.cycle()  # released after serving: no miss
    assert metric("kdrl.prewarm.windows", kdrl_result="hit") == before["hit"] + 1
    assert metric("kdrl.prewarm.windows", kdrl_result="miss") == before["miss"]
    invoked["shop/hello"] = False
    env["state"]["forecasts"] = {"shop/hello": likely()}
    await cycle.cycle()
    env["state"]["forecasts"] = {}
    await cycle.cycle()  # released unused: a miss
    assert metric("kdrl.prewarm.windows", kdrl_result="miss") == before["miss"] + 1
    assert metric("kdrl.prewarm.windows", kdrl_result="hit") == before["hit"] + 1


def test_the_catalog_keeps_of_a_service_only_what_the_planner_reads() -> None:
    """managedFields and kubectl's last-applied copy are dropped on arrival (client-go's
    informer transforms do the same): at the function cap they would be most of the memory."""
    full = knative_service()
    full["metadata"] |= {
        "uid": "u1",
        "resourceVersion": "42",
        "annotations": {
            "kdrl.dev/prewarm": "false",
            "kubectl.kubernetes.io/last-applied-configuration": "x" * 4000,
        },
        "managedFields": [{"manager": f"m{i}", "fieldsV1": {"f:spec": {"x" * 50: {}}}} for i in range(20)],
    }
    full["status"] |= {"conditions": [{"type": "Ready", "status": "True"}] * 3, "url": "http://hello.shop"}
    catalog = FunctionCatalog()
    catalog.services.replace([full])
    (kept,) = catalog.services.items.values()
    assert "managedFields" not in kept["metadata"] and "conditions" not in kept["status"]
    assert list(kept["metadata"]["annotations"]) == ["kdrl.dev/prewarm"]
    assert catalog.states() == {"shop/hello": function_state(full)}  # the planner sees the same
    assert len(repr(kept)) < len(repr(full)) / 5
