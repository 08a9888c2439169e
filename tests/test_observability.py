"""What an SRE sees, against a running service that watches the fake API server with
prewarming on and is fed placement calls, binds, pod lifecycle events and invocations:

- every series the Grafana dashboard and the alert rules query is on `/metrics`;
- the decision explorer in a real browser (headless Chromium) shows it all as text, with no
  console errors. A pod name is hostile on purpose: markup in it must render as text (function
  names cannot carry markup: the event sink admits only Kubernetes names). A screenshot lands
  in `out/test-artifacts/ui.png` for humans (docs/ui.png is one).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import tempfile
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from cloudevents.core.bindings.http import to_binary_event
from prometheus_client.parser import text_string_to_metric_families

from bench import synthetic
from forecaster.forecasting import Forecaster
from forecaster.history import MinuteCounts
from plugin import app as service
from plugin.forecasts import ForecastLoop
from plugin.keys import CACHE, FORECASTS, PREWARM
from plugin.metrics import MAX_LABEL_LENGTH, OTHER, BoundedLabel
from plugin.settings import HistorySettings, KubeSettings, PolicySettings, PrewarmSettings, Settings
from tests import cdp
from tests.conftest import metric
from tests.fakekube import FakeKube
from tests.test_events import event
from tests.test_prewarm_loop import knative_service, likely

ARTIFACT = Path(__file__).resolve().parent.parent / "out" / "test-artifacts" / "ui.png"
HOSTILE_POD = "<script>window.pwned=1</script>"


@pytest.fixture
def browser() -> str:
    found = cdp.find_chromium()
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing: .ci/run installs Debian's chromium package before the tests")
        pytest.skip("no chromium here (apt-get install chromium); CI runs this test")
    return found


@pytest.fixture
async def served(fake_kube: tuple[FakeKube, str]) -> AsyncIterator[tuple[str, Any]]:
    """`kdrl serve`'s app on a real port, watching the fake cluster, prewarming on."""
    fake, url = fake_kube
    for i in range(3):
        await fake.add("nodes", synthetic.node(f"node-{i}", cpu="8", memory="32Gi"))
    await fake.add("services", knative_service())
    await fake.add("revisions", {"metadata": {"name": "hello-00002", "namespace": "shop"}})
    settings = Settings(
        kube=KubeSettings(api_url=url, watch_timeout_s=1, backoff_max_s=0.2, request_timeout_s=2),
        history=HistorySettings(path=Path(tempfile.mkdtemp()) / "history.db"),
        policy=PolicySettings(name="kube-default"),
        prewarm=PrewarmSettings(identity="replica-a", shadow=True),
    )
    app = await service.create_app(settings)
    async with TestServer(app) as server:
        deadline = asyncio.get_running_loop().time() + 10
        while not app[CACHE].snapshot.synced or len(app[CACHE].snapshot.nodes) < 3:
            assert asyncio.get_running_loop().time() < deadline, "the cluster cache never synced"
            await asyncio.sleep(0.05)
        yield str(server.make_url("")), app


async def feed(base: str, app: Any) -> None:
    """Two pods through filter and prioritize, invocations of two functions, one plan."""
    async with ClientSession() as http:
        for name, uid in (("hello-00002-deployment-abc", "uid-1"), (HOSTILE_POD, "uid-2")):
            pod = synthetic.knative_pod(name, service="hello", namespace="shop", uid=uid, memory="512Mi")
            args = {"Pod": pod, "Nodes": None, "NodeNames": ["node-0", "node-1", "node-2", "node-9"]}
            for verb in ("filter", "prioritize"):
                async with http.post(f"{base}/scheduler/{verb}", data=json.dumps(args)) as response:
                    assert response.status == 200, await response.text()
        a_minute_ago = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
        for function in ("shop/hello", "shop/cart"):
            report = {"function": function, "start": a_minute_ago, "seconds": 60, "count": 3}
            message = to_binary_event(event(report, id_=function))
            async with http.post(f"{base}/events", data=message.body, headers=message.headers) as response:
                assert response.status == 202, await response.text()
    loop = app[PREWARM]
    loop.forecasts = lambda: {"shop/hello": likely()}
    await loop.cycle()


async def test_the_explorer_shows_decisions_plan_and_history_as_text(
    browser: str, served: tuple[str, Any]
) -> None:
    base, app = served
    await feed(base, app)
    async with cdp.chromium(browser) as page:
        await page.send("Page.navigate", url=f"{base}/ui")
        await page.wait_for("document.querySelectorAll('#decisions tbody tr.decision').length === 2")
        text = await page.wait_for("document.querySelector('#warm tbody').innerText")
        assert "shop/hello" in text  # the plan's warm entry, with its reason
        summary = await page.evaluate("document.getElementById('prewarm-summary').innerText")
        assert re.search(r"1 functions warm \(\d+\.\d\d of a \d+\.\d\d GiB idle-memory target\)", summary)
        body = await page.evaluate("document.body.innerText")
        assert "shop/" + HOSTILE_POD in body  # markup shown as text ...
        assert "kube-default" in body
        assert await page.evaluate("window.pwned === undefined")  # ... and never run
        assert await page.evaluate("document.querySelectorAll('img, script:not([src])').length") == 0
        options = await page.evaluate(
            "[...document.querySelectorAll('#function-select option')].map(o => o.value)"
        )
        assert options == ["shop/cart", "shop/hello"]
        await page.wait_for("document.querySelector('#chart svg rect.bar') !== null")
        function = await page.evaluate("document.getElementById('function-detail').innerText")
        assert "observed cold starts none, priced at 5.00 s (the default)" in function  # no pod seen yet
        await page.evaluate("document.querySelector('#decisions tbody tr.decision').click()")
        detail = await page.wait_for(
            "document.querySelector('tr.detail') && document.querySelector('tr.detail').innerText"
        )
        assert "Top candidates" in detail and "BalancedAllocation" in detail
        assert "unknown_node: 1" in detail  # node-9 is not in the cluster: the filter said why
        await page.screenshot(ARTIFACT)
        assert page.errors == []
    assert ARTIFACT.stat().st_size > 10_000


OBSERVABILITY = Path(__file__).resolve().parent.parent / "knative" / "observability"
SERIES = re.compile(r"\b((?:kdrl|http_server)_[a-z0-9_]+)\b")
GROUPED_BY = re.compile(r"\bby \(([^)]*)\)")
MATCHERS = re.compile(r"\{([^}]*)\}")


def queries() -> list[str]:
    """Every PromQL expression of the dashboard's panels and of the alert rules."""
    dashboard = json.loads((OBSERVABILITY / "dashboard.json").read_text())
    panels = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    rules = yaml.safe_load((OBSERVABILITY / "prometheusrule.yaml").read_text())
    alerts = [rule["expr"] for group in rules["spec"]["groups"] for rule in group["rules"]]
    assert len(panels) > 20 and len(alerts) == 5
    return panels + alerts


def scraped(text: str) -> dict[str, set[str]]:
    """Series names on a Prometheus text page, with the label names each carries."""
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


async def realistic_traffic(base: str, app: Any, fake: FakeKube) -> None:
    """What a day brings, in small: placements and binds (one conflicting), pods going Ready
    (a cold start with its parts), invocations, a malformed event, a plan, forecast cycles."""
    pod = synthetic.knative_pod("hello-00002-deployment-abc", service="hello", namespace="shop", uid="uid-1")
    await fake.add("pods", pod)
    await feed(base, app)
    created = datetime.now(UTC) - timedelta(seconds=9)
    ready = dict(
        pod,
        status={
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastTransitionTime": (created + timedelta(seconds=1)).isoformat(),
                },
                {
                    "type": "Ready",
                    "status": "True",
                    "lastTransitionTime": (created + timedelta(seconds=7)).isoformat(),
                },
            ]
        },
    )
    ready["metadata"] = dict(pod["metadata"], creationTimestamp=created.isoformat())
    lifecycle = event(ready, type_="dev.knative.apiserver.resource.update", id_="pod-ready")
    binding = {
        "PodName": pod["metadata"]["name"],
        "PodNamespace": "shop",
        "PodUID": "uid-1",
        "Node": "node-0",
    }
    async with ClientSession() as http:
        for _ in range(2):  # bound, then 409: already bound
            async with http.post(f"{base}/scheduler/bind", data=json.dumps(binding)) as response:
                assert response.status == 200
        message = to_binary_event(lifecycle)
        async with http.post(f"{base}/events", data=message.body, headers=message.headers) as response:
            assert response.status == 202, await response.text()
        async with http.post(f"{base}/events", data=b"{", headers={"ce-id": "x"}) as response:
            assert response.status == 400
        unheard = to_binary_event(event({"order": 7}, type_="com.example.order.placed", id_="o7"))
        async with http.post(f"{base}/events", data=unheard.body, headers=unheard.headers) as response:
            assert response.status == 202  # a Broker delivers all sorts: acknowledged, counted
    forecasts = app[FORECASTS]
    deadline = asyncio.get_running_loop().time() + 120
    while forecasts.context is None:  # the service's own first cycle (numba warms up first)
        assert asyncio.get_running_loop().time() < deadline, "no forecast cycle in two minutes"
        await asyncio.sleep(0.2)
    started = forecasts.clock()
    for minutes_later in (1, 3):  # the second judges the first one's minute, now complete
        forecasts.clock = lambda m=minutes_later: started + 60 * m
        await asyncio.get_running_loop().run_in_executor(None, forecasts.cycle, False)


async def test_every_series_the_dashboard_and_alerts_query_is_exported(
    served: tuple[str, Any], fake_kube: tuple[FakeKube, str]
) -> None:
    base, app = served
    await realistic_traffic(base, app, fake_kube[0])
    async with ClientSession() as http, http.get(f"{base}/metrics") as response:
        exported = scraped(await response.text())
    for expr in queries():
        names = set(SERIES.findall(MATCHERS.sub("", GROUPED_BY.sub("", expr))))
        assert names, expr
        missing = names - exported.keys()
        assert not missing, f"{expr}: {sorted(missing)} not exported"
        labels = set().union(*(exported[n] for n in names))
        grouped = {label.strip() for group in GROUPED_BY.findall(expr) for label in group.split(",")}
        matched = {m.split("=")[0].strip() for inside in MATCHERS.findall(expr) for m in inside.split(",")}
        wanted = (grouped | matched) - {"le"}
        assert wanted <= labels, f"{expr}: uses labels {sorted(wanted - labels)}, which no series carries"
    assert exported["kdrl_coldstart_scheduling_duration_seconds_count"]  # the parts were observable


def test_label_values_from_user_input_are_cut_and_bounded() -> None:
    label = BoundedLabel(limit=2)
    assert label("a" * 100) == "a" * MAX_LABEL_LENGTH
    assert label("b") == "b"
    assert label("c") == OTHER  # past the limit: shared
    assert label("b") == "b" and label("a" * 70) == "a" * MAX_LABEL_LENGTH  # the known keep theirs


def test_a_label_value_that_is_not_unicode_text_is_escaped() -> None:
    """A lone surrogate cannot be written out: as a label it failed every later scrape."""
    value = BoundedLabel(limit=5)("com.example.\ud800")
    assert value == "com.example.\\ud800"
    value.encode("utf-8")  # would raise before


def test_the_one_minute_error_is_judged_once_the_minute_is_complete() -> None:
    counts = MinuteCounts()
    for minute in range(1000, 1100):
        counts.add("shop/cart", minute, 2 + minute % 2)
    now = {"t": 1099 * 60 + 30.0}
    loop = ForecastLoop(forecaster=Forecaster(counts), clock=lambda: now["t"])
    expected = float(loop.cycle(False)["shop/cart"].expected[0])  # for minute 1100
    counts.add("shop/cart", 1100, 9)
    now["t"] += 60
    loop.cycle(False)  # minute 1100 is still running: not judged yet
    now["t"] += 60
    loop.cycle(False)
    assert metric("kdrl.forecast.error") == pytest.approx(abs(9 - expected))
    assert metric("kdrl.forecast.functions") == 1
