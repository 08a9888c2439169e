"""OpenTelemetry set-up: an OTLP exporter only when the standard variables ask for one."""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from plugin import telemetry


def exporters(provider: TracerProvider) -> list[object]:
    processors = provider._active_span_processor._span_processors
    return [p.span_exporter for p in processors if isinstance(p, BatchSpanProcessor)]  # type: ignore[attr-defined]


def test_no_exporter_without_an_endpoint() -> None:
    provider = telemetry.tracer_provider({})
    assert exporters(provider) == []
    assert provider.resource.attributes["service.name"] == "kdrl"
    provider.shutdown()


def test_otlp_exporter_when_an_endpoint_is_set() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SERVICE_NAME": "kdrl-test"}
    provider = telemetry.tracer_provider(env)
    assert [type(e) for e in exporters(provider)] == [OTLPSpanExporter]
    assert provider.resource.attributes["service.name"] == "kdrl-test"
    provider.shutdown()


def test_metrics_go_to_prometheus_and_to_otlp_only_when_an_endpoint_is_set() -> None:
    assert [type(r) for r in telemetry.metric_readers({})] == [PrometheusMetricReader]
    readers = telemetry.metric_readers(
        {"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://127.0.0.1:4318/v1/metrics"}
    )
    assert [type(r) for r in readers] == [PrometheusMetricReader, PeriodicExportingMetricReader]
    for reader in readers:
        reader.shutdown()
