"""Every metric the service exports, in one place (README "Observability" lists them).

Instruments come from the OpenTelemetry API; `telemetry.setup` installs the SDK and its
Prometheus reader, so until then (and with `KDRL_METRICS=false`) recording costs a no-op call.
Names follow the semantic conventions where one exists (`http.server.request.duration`) and
`kdrl.*` otherwise; the Prometheus exporter renders `kdrl.extender.decisions` as
`kdrl_extender_decisions_total`, a unit of `s` as `_seconds`, `By` as `_bytes`. Every label has
a bounded set of values: fixed codes, or user input passed through a `BoundedLabel`.

Gauges of state (cache age, prewarm holdings, queue depth) are synchronous gauges set by
`sample`, which `/metrics` calls before rendering and a background task calls every few
seconds for push exporters: they read the app's state then, with no callback registry.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from opentelemetry import metrics

SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
COLD_START_SECONDS = (0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0, 300.0)
CYCLE_SECONDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
NODE_COUNTS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)

OTHER = "other"
MAX_LABEL_LENGTH = 63  # a Kubernetes name's limit; longer input is cut, not refused


class BoundedLabel:
    """Label values from user input: the first `limit` distinct values keep their own series,
    later ones share `other`, so a flood of names cannot grow Prometheus without bound."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        # A lone surrogate cannot be encoded: one such label would fail every later scrape.
        value = value[:MAX_LABEL_LENGTH].encode("utf-8", "backslashreplace").decode("utf-8")
        if value in self._seen:
            return value
        if len(self._seen) >= self.limit:
            return OTHER
        self._seen.add(value)
        return value


meter = metrics.get_meter("kdrl")


def soon(record: Callable[..., None], *args: Any) -> None:
    """Record after the current answer is written: an SDK measurement costs 10-20 us, which
    on the extender's path would be latency the scheduler waits for. On the event loop the
    call runs at its next turn, after this handler's response went out; elsewhere, now."""
    try:
        asyncio.get_running_loop().call_soon(record, *args)
    except RuntimeError:
        record(*args)


class Tally:
    """A counter for the scheduler's hot path: adding is a dict update (a fraction of a
    microsecond, where an SDK counter costs ~9 us); the SDK reads the totals when it collects."""

    def __init__(self, name: str, *, description: str, unit: str = "") -> None:
        self._counts: Counter[tuple[tuple[str, str], ...]] = Counter()
        meter.create_observable_counter(name, callbacks=[self._observe], unit=unit, description=description)

    def add(self, amount: int, attributes: Mapping[str, str]) -> None:
        self._counts[tuple(attributes.items())] += amount

    def total(self, total: int, attributes: Mapping[str, str]) -> None:
        """Set the running total of a count kept elsewhere (sampled, like a gauge)."""
        self._counts[tuple(attributes.items())] = total

    def _observe(self, options: metrics.CallbackOptions) -> list[metrics.Observation]:
        # list() copies in one step under the GIL: an exporter thread may collect meanwhile.
        return [metrics.Observation(total, dict(key)) for key, total in list(self._counts.items())]


# HTTP, every route: the stable semantic convention's histogram. Extender routes also carry
# `kdrl.policy`: one measurement per call serves both "by route" and "by verb and policy".
http_duration = meter.create_histogram(
    "http.server.request.duration",
    unit="s",
    description="Duration of HTTP server requests",
    explicit_bucket_boundaries_advisory=SECONDS,
)

# The extender.
EXTENDER_VERBS = ("filter", "prioritize", "bind")
DECISION_OUTCOMES = (
    "scored",
    "all_filtered",
    "fallback",
    "bound",
    "bind_refused",
    "bind_conflict",
    "bind_error",
)
decisions = Tally(
    "kdrl.extender.decisions",
    description="Extender answers by policy and outcome (scored, all filtered, fallback, bind results)",
)
rejections = Tally(
    "kdrl.extender.filter.rejections", unit="{node}", description="Nodes the filter verb rejected, by reason"
)
candidates = meter.create_histogram(
    "kdrl.extender.candidates",
    unit="{node}",
    description="Candidate nodes per pod: the filter's, or prioritize's when no filter came first",
    explicit_bucket_boundaries_advisory=NODE_COUNTS,
)
decisions_recorded = meter.create_counter(
    "kdrl.decisions.recorded",
    unit="{decision}",
    description="Served placements for the closed loop: written, dropped (too many waiting), failed",
)
model_reloads = meter.create_counter(
    "kdrl.model.reloads",
    description="Changed model files: reloaded (now serving) or failed (the serving model kept)",
)
policy_fallback = meter.create_gauge(
    "kdrl.policy.fallback",
    description="1 while the configured policy could not load and kube-default serves instead",
)
cache_age = meter.create_gauge(
    "kdrl.cluster.cache.age",
    unit="s",
    description="Seconds the extender's cluster snapshot may have missed changes (0 while watches are live)",
)
cache_nodes = meter.create_gauge(
    "kdrl.cluster.nodes", unit="{node}", description="Nodes in the cluster cache"
)
watch_restarts = meter.create_counter(
    "kdrl.cluster.watch.restarts",
    description="Watches relisted, by collection and reason (expired: 410 Gone; error: anything else)",
)

# Cold starts as Knative pods report them (ApiServerSource): creation -> Ready, and its parts.
cold_start = meter.create_histogram(
    "kdrl.coldstart.duration",
    unit="s",
    description="Observed cold starts, pod creation to Ready, by namespace and service",
    explicit_bucket_boundaries_advisory=COLD_START_SECONDS,
)
cold_start_scheduling = meter.create_histogram(
    "kdrl.coldstart.scheduling.duration",
    unit="s",
    description="Cold start part: pod creation to bound to a node (PodScheduled)",
    explicit_bucket_boundaries_advisory=COLD_START_SECONDS,
)
cold_start_startup = meter.create_histogram(
    "kdrl.coldstart.startup.duration",
    unit="s",
    description="Cold start part: bound to a node to Ready (image pull, start, readiness probe)",
    explicit_bucket_boundaries_advisory=COLD_START_SECONDS,
)
services = BoundedLabel(limit=500)  # "namespace/service" pairs with their own cold-start series

# Prewarming.
prewarm_functions = meter.create_gauge(
    "kdrl.prewarm.functions", description="Functions in the latest plan's warm entries, by mode"
)
prewarm_replicas = meter.create_gauge(
    "kdrl.prewarm.replicas", unit="{replica}", description="Replicas the latest plan holds warm, by mode"
)
prewarm_memory = meter.create_gauge(
    "kdrl.prewarm.memory", unit="By", description="Memory of the replicas the latest plan holds warm, by mode"
)
prewarm_idle_memory = meter.create_gauge(
    "kdrl.prewarm.idle_memory",
    unit="By",
    description="Memory the latest plan's warm replicas are expected to leave idle until the next plan, "
    "by budget: expected (what it holds) or target (the hybrid histogram's share it may spend up to)",
)
prewarm_changes = meter.create_counter(
    "kdrl.prewarm.changes", description="min-scale changes to revisions, by action and result"
)
prewarm_pulls = meter.create_counter(
    "kdrl.prewarm.prepulls", description="Pre-pull pods by result (started, succeeded, failed, timed_out)"
)
prewarm_windows = meter.create_counter(
    "kdrl.prewarm.windows",
    description="Warm windows ended, by result: hit (the function was invoked while held) or miss",
)

# The forecaster.
forecast_cycle = meter.create_histogram(
    "kdrl.forecast.cycle.duration",
    unit="s",
    description="Forecast cycles, by whether models were re-chosen",
    explicit_bucket_boundaries_advisory=CYCLE_SECONDS,
)
forecast_failures = meter.create_counter("kdrl.forecast.failures", description="Forecast cycles that failed")
forecast_fallbacks = meter.create_counter(
    "kdrl.forecast.fallbacks",
    description="Cycle steps (model choice, forecast) a remote engine failed, run locally instead, by engine",
)
forecast_functions = meter.create_gauge("kdrl.forecast.functions", description="Functions forecast")
forecast_models = meter.create_gauge("kdrl.forecast.models", description="Functions per chosen model")
forecast_error = meter.create_gauge(
    "kdrl.forecast.error",
    description="Mean absolute error of the one-minute-ahead forecast over functions (invocations), "
    "last complete minute",
)

# CloudEvents.
events_received = meter.create_counter("kdrl.events.received", description="CloudEvents handled, by type")
events_unknown = meter.create_counter(
    "kdrl.events.unknown", description="CloudEvents acknowledged that invoke nothing known, by type"
)
events_duplicates = meter.create_counter(
    "kdrl.events.duplicates", description="Redelivered CloudEvents not counted again"
)
events_rejected = meter.create_counter(
    "kdrl.events.rejected", description="Event requests refused, by HTTP status (400, 413, 429)"
)
events_queue = meter.create_gauge(
    "kdrl.events.queue.depth", description="Event requests waiting for their commit to the history"
)
event_types = BoundedLabel(limit=100)

# The history in memory (KDRL_MAX_FUNCTIONS): the database keeps what memory forgets.
history_functions = meter.create_gauge(
    "kdrl.history.functions", description="Functions whose minute history is held in memory and forecast"
)
history_forgotten = Tally(
    "kdrl.history.forgotten",
    description="At the cap: functions evicted (the least recently invoked name no Knative Service "
    "has) and counts refused (every held function is a Service), by reason",
)


def start_counters(policy: str) -> None:
    """Zero every counter whose labels are known in advance, so dashboards and alerts see a
    series (rate 0) before the first event instead of an absent one."""
    for outcome in DECISION_OUTCOMES:
        decisions.add(0, {"kdrl.policy": policy, "kdrl.outcome": outcome})
    for action in ("warm", "restore"):
        for result in ("applied", "failed"):
            prewarm_changes.add(0, {"kdrl.action": action, "kdrl.result": result})
    for result in ("started", "succeeded", "failed", "timed_out"):
        prewarm_pulls.add(0, {"kdrl.result": result})
    for result in ("hit", "miss"):
        prewarm_windows.add(0, {"kdrl.result": result})
    for status in (400, 413, 429):
        events_rejected.add(0, {"http.response.status_code": status})
    events_duplicates.add(0)
    forecast_failures.add(0)


class Settable(Protocol):
    def set(self, amount: float, attributes: Mapping[str, str] | None = None) -> None: ...


def set_all(gauge: Settable, values: Mapping[str, float], key: str) -> None:
    """One series per value of the label `key` (e.g. functions per model)."""
    for label, value in values.items():
        gauge.set(value, {key: label})
