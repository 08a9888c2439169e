"""OpenTelemetry SDK setup, done once by the entrypoint; the rest of the code uses only the API.
Traces go out over OTLP; metrics are scraped by Prometheus at `/metrics`.

Spans are exported over OTLP/HTTP when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` variables are set, and dropped otherwise (the provider
still exists, so span attributes stay cheap to set and tests can attach an exporter).
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import metrics, trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

OTLP_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def setup(env: Mapping[str, str]) -> TracerProvider:
    """Install the global tracer and meter providers; the caller shuts the tracer down at exit.

    Metrics are read by a Prometheus reader into `prometheus_client`'s default registry,
    which the app serves at `/metrics`."""
    provider = tracer_provider(env)
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(
        MeterProvider(resource=provider.resource, metric_readers=[PrometheusMetricReader()])
    )
    return provider


def tracer_provider(env: Mapping[str, str]) -> TracerProvider:
    """A provider for `kdrl` (or `OTEL_SERVICE_NAME`), exporting over OTLP/HTTP when configured."""
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", "kdrl")})
    provider = TracerProvider(resource=resource)
    if any(env.get(v) for v in OTLP_VARIABLES):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider
