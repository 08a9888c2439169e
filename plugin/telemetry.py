"""OpenTelemetry SDK setup, done once by the entrypoint; the rest of the code uses only the API.
Traces go out over OTLP; metrics are scraped by Prometheus at `/metrics`, and pushed over OTLP too.

Spans are exported over OTLP/HTTP when the standard `OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` variables are set, and dropped otherwise (the provider
still exists, so span attributes stay cheap to set and tests can attach an exporter). Metrics
go to OTLP when `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` is set:
that path carries exemplars (the trace id of a measurement made inside a sampled span), which
the Prometheus exporter does not render.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import metrics, trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider, TraceBasedExemplarFilter
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

OTLP_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
OTLP_METRICS_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")


def setup(env: Mapping[str, str], *, with_metrics: bool = True) -> TracerProvider:
    """Install the global tracer and meter providers; the caller shuts the tracer down at exit.

    Metrics are read by a Prometheus reader into `prometheus_client`'s default registry,
    which the app serves at `/metrics`. Without `with_metrics` no meter provider is installed
    and every instrument stays the API's no-op."""
    provider = tracer_provider(env)
    trace.set_tracer_provider(provider)
    if with_metrics:
        readers = metric_readers(env)
        # Exemplars cost about half of each measurement, and only OTLP carries them.
        exemplars = TraceBasedExemplarFilter() if len(readers) > 1 else AlwaysOffExemplarFilter()
        metrics.set_meter_provider(
            MeterProvider(resource=provider.resource, metric_readers=readers, exemplar_filter=exemplars)
        )
    return provider


def metric_readers(env: Mapping[str, str]) -> list[MetricReader]:
    """Prometheus always; OTLP/HTTP as well when an endpoint is configured."""
    readers: list[MetricReader] = [PrometheusMetricReader()]
    if any(env.get(v) for v in OTLP_METRICS_VARIABLES):
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter()))
    return readers


def tracer_provider(env: Mapping[str, str]) -> TracerProvider:
    """A provider for `kdrl` (or `OTEL_SERVICE_NAME`), exporting over OTLP/HTTP when configured."""
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME", "kdrl")})
    provider = TracerProvider(resource=resource)
    if any(env.get(v) for v in OTLP_VARIABLES):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider
