"""OpenTelemetry set-up: an OTLP exporter only when the standard variables ask for one."""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
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
