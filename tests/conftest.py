"""Shared fixtures: an in-memory span exporter, the fake API server, offline and watching apps."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from kubernetes.aio import client as kclient
from opentelemetry import metrics, trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from bench import synthetic
from plugin import app as service
from plugin.settings import HistorySettings, KubeSettings, PolicySettings, Settings
from tests.fakekube import FakeKube

_EXPORTER = InMemorySpanExporter()
_PROVIDER = TracerProvider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))
trace.set_tracer_provider(_PROVIDER)  # the global provider can be set once per process
_METRICS = InMemoryMetricReader()
# In-memory for assertions, Prometheus for the service's own /metrics (as `kdrl serve` has it).
metrics.set_meter_provider(MeterProvider(metric_readers=[_METRICS, PrometheusMetricReader()]))

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "cluster"


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


def metric(name: str, **attributes: object) -> float:
    """The current value of an in-process metric: a counter's or gauge's value, a histogram's
    count, summed over the series whose attributes include `attributes` (dots as `_` in keys)."""
    wanted = {key.replace("_", "."): value for key, value in attributes.items()}
    data = _METRICS.get_metrics_data()
    total = 0.0
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for found in scope.metrics:
                if found.name != name:
                    continue
                for point in found.data.data_points:
                    if all(point.attributes.get(k) == v for k, v in wanted.items()):
                        total += getattr(point, "value", None) or getattr(point, "count", 0)
    return total


def write_objects(directory: Path, name: str, items: list[dict[str, Any]]) -> Path:
    path = directory / name
    path.write_text(json.dumps(synthetic.as_list("List", items)))
    return path


@pytest.fixture
def small_cluster() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Three nodes: a roomy one, a nearly full one, a GPU one with a taint; one pod placed."""
    nodes = [
        synthetic.node(
            "roomy", cpu="8", memory="32Gi", images=[([synthetic.image_ref(1)], 300 * synthetic.MiB)]
        ),
        synthetic.node("full", cpu="1", memory="2Gi"),
        synthetic.node(
            "gpu",
            cpu="8",
            memory="61Gi",
            gpus=1,
            taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        ),
    ]
    pods = [synthetic.knative_pod("busy", service="busy", cpu="900m", memory="1Gi", node_name="full")]
    return nodes, pods


@pytest.fixture
async def offline_client(
    aiohttp_client: Any, tmp_path: Path, small_cluster: tuple[list[dict[str, Any]], list[dict[str, Any]]]
) -> TestClient[web.Request, web.Application]:
    nodes, pods = small_cluster
    settings = Settings(
        kube=KubeSettings(
            nodes_file=write_objects(tmp_path, "nodes.json", nodes),
            pods_file=write_objects(tmp_path, "pods.json", pods),
        ),
        history=HistorySettings(path=tmp_path / "history.db"),
        policy=PolicySettings(name="kube-default"),  # upstream arithmetic: answers the tests can derive
    )
    result: TestClient[web.Request, web.Application] = await aiohttp_client(
        await service.create_app(settings)
    )
    return result


@pytest.fixture
async def fake_kube() -> AsyncIterator[tuple[FakeKube, str]]:
    """A fake API server on a real loopback port, and its URL."""
    fake = FakeKube()
    runner = web.AppRunner(fake.app(), shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield fake, f"http://127.0.0.1:{port}"
    await runner.cleanup()


def api_client(url: str) -> kclient.ApiClient:
    return kclient.ApiClient(kclient.Configuration(host=url))


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    """A local Ray of 2 CPUs, as in CI (the address of its GCS), for one test module."""
    import logging

    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    yield str(ray.get_runtime_context().gcs_address)
    ray.shutdown()
