"""The CloudEvents sink: Knative Eventing delivers here what the forecaster learns from.

`POST /events` (and `POST /`) takes binary, structured and batched CloudEvents 1.0, parsed
with the `cloudevents` 2.x SDK (a batch is a JSON array of structured events; the SDK has no
batch mode). Understood: `dev.kdrl.invocations.v1`, counts from adapters; ApiServerSource
events about Knative pods and revisions (`lifecycle`); and any event a Broker delivers, as
one invocation of each Knative Service whose Trigger would deliver it (`triggers`).
Events that invoke nothing known are acknowledged, counted and logged at debug level.
Answers: 202 with an empty body once the effects are committed to the history database
(several requests share one commit), 400 for a malformed event (Eventing does not retry it),
413 above the size limit, 429 while the commit queue is full (Eventing retries it).
Redeliveries are deduplicated by (source, id).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar

from aiohttp import web
from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.bindings.http import HTTPMessage, from_http_event
from cloudevents.core.exceptions import BaseCloudEventException
from opentelemetry import context, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from forecaster.history import ColdStart, Count, Effect, HistoryStore, Lifecycle, MinuteCounts
from plugin import convert, lifecycle, metrics
from plugin.errors import BadRequest, body_deadline
from plugin.store_thread import StoreThread
from plugin.triggers import TriggerIndex, attributes_of

logger = logging.getLogger(__name__)
T = TypeVar("T")
tracer = trace.get_tracer(__name__)

INVOCATIONS = "dev.kdrl.invocations.v1"
BATCH_CONTENT_TYPE = "application/cloudevents-batch"
MAX_COUNT = 10**8  # per report: far above any function's minute (the trace's busiest: ~10^5)
MAX_WINDOW_S = 3600  # one report covers at most an hour
FUTURE_SLACK = timedelta(minutes=5)  # clock skew we forgive
OLDEST = timedelta(days=30)  # older reports are refused: history beyond two days is hourly anyway
MAX_KEY_LENGTH = 1024  # an event's source and id, the deduplication key


class QueueFull(Exception):
    """The commit queue is at its limit: answer 429 so the sender retries later."""


@dataclass
class _Pending:
    batches: list[tuple[tuple[str, str] | None, Effect]]
    done: asyncio.Future[list[bool]]


@dataclass
class EventSink:
    """Turns events into counts and commits them in groups; owns the in-memory view too."""

    store: HistoryStore
    counts: MinuteCounts
    clock: Callable[[], float]
    triggers: TriggerIndex = field(default_factory=TriggerIndex)
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    max_pending: int = 1024
    unknown_types: Counter[str] = field(default_factory=Counter)
    # Told of each observed cold start (the decision recorder joins them to its decisions).
    observers: list[Callable[[ColdStart], None]] = field(default_factory=list)
    _queue: list[_Pending] = field(default_factory=list)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    # Commits, compaction and close never overlap (`StoreThread`).
    _io: StoreThread = field(default_factory=lambda: StoreThread("history"))

    async def on_store(self, job: Callable[[], T]) -> T:
        """Run `job` on the history's own thread."""
        return await self._io.run(job)

    async def close(self) -> None:
        """Close the store after whatever is running on it, then its thread."""
        await self._io.aclose(self.store.close)

    async def commit(self, batches: list[tuple[tuple[str, str] | None, Effect]]) -> list[bool]:
        """Wait until these events are durable; returns which were new (not redeliveries)."""
        if len(self._queue) >= self.max_pending:
            raise QueueFull()
        pending = _Pending(batches, asyncio.get_running_loop().create_future())
        self._queue.append(pending)
        self._wake.set()
        return await pending.done

    async def run(self) -> None:
        """Commit whatever has queued up, one transaction at a time, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            group, self._queue = self._queue, []
            if not group:
                continue
            flat = [batch for pending in group for batch in pending.batches]
            try:
                fresh = await self.on_store(partial(self.store.record, flat, self.clock()))
            except Exception:  # one request's rows may be at fault: commit each on its own
                logger.warning("committing %d events together failed; one request at a time", len(flat))
                for pending in group:
                    await self._commit_alone(pending)
                continue
            position = 0
            for pending in group:
                mine = fresh[position : position + len(pending.batches)]
                position += len(pending.batches)
                self._apply(pending, mine)

    async def _commit_alone(self, pending: _Pending) -> None:
        """One request's events in their own transaction: a row the database refuses fails its
        own request only (answered 500, rolled back, nothing acknowledged), never a neighbour's."""
        try:
            fresh = await self.on_store(partial(self.store.record, pending.batches, self.clock()))
        except Exception as error:
            logger.exception("committing %d events failed", len(pending.batches))
            pending.done.set_exception(error)
            return
        self._apply(pending, fresh)

    def _apply(self, pending: _Pending, fresh: list[bool]) -> None:
        """Committed: the new events into memory, and the request answered."""
        for (_, effect), new in zip(pending.batches, fresh):
            if new:
                for c in effect.counts:
                    self.counts.add(c.function, c.minute, c.count)
                for cold_start in self.lifecycle.apply(effect):
                    _record(cold_start)
                    for observer in self.observers:
                        observer(cold_start)
        pending.done.set_result(fresh)

    @property
    def pending(self) -> int:
        """Requests waiting for their commit."""
        return len(self._queue)


def _record(cold_start: ColdStart) -> None:
    """An observed cold start into the histograms, by namespace and service (bounded)."""
    namespace, _, service = cold_start.function.partition("/")
    if metrics.services(cold_start.function) == metrics.OTHER:
        namespace = service = metrics.OTHER
    attributes = {"k8s.namespace.name": namespace, "kdrl.service": service}
    metrics.cold_start.record(cold_start.seconds, attributes)
    if cold_start.scheduling_s is not None and cold_start.startup_s is not None:
        metrics.cold_start_scheduling.record(cold_start.scheduling_s, attributes)
        metrics.cold_start_startup.record(cold_start.startup_s, attributes)


async def compact_forever(sink: EventSink, *, every_s: float = 3600.0) -> None:
    """Hourly: roll minutes older than two days into hours, forget old dedup keys."""
    while True:
        now = sink.clock()
        try:
            await sink.on_store(partial(sink.store.compact, now_minute=int(now // 60), now=now))
        except Exception:  # the next hour tries again; nothing acknowledged depends on it
            logger.exception("history compaction failed")
        await asyncio.sleep(every_s)


def parse(headers: Mapping[str, str], body: bytes) -> list[BaseCloudEvent]:
    """The events of one HTTP request, in any content mode."""
    content_type = headers.get("Content-Type", headers.get("content-type", ""))
    try:
        if content_type.startswith(BATCH_CONTENT_TYPE):
            items = json.loads(body)
            if not isinstance(items, list):
                raise BadRequest("a batch must be a JSON array of structured events")
            structured = {"content-type": "application/cloudevents+json"}
            return [
                from_http_event(HTTPMessage(headers=structured, body=json.dumps(item).encode()))
                for item in items
            ]
        return [from_http_event(HTTPMessage(headers=dict(headers), body=body))]
    except (BaseCloudEventException, ValueError, TypeError, AttributeError) as error:
        raise BadRequest(f"not a valid CloudEvent: {error}") from error
    except RecursionError:  # JSON nested past the stack: no event is
        raise BadRequest("not a valid CloudEvent: nested too deeply") from None


def invocation_counts(event: BaseCloudEvent, *, now: datetime) -> list[Count]:
    """The counts a `dev.kdrl.invocations.v1` event reports, spread over the minutes they cover."""
    data = event.get_data()
    reports = data if isinstance(data, list) else [data]
    counts: list[Count] = []
    for i, report in enumerate(reports):
        where = f"data[{i}]" if isinstance(data, list) else "data"
        if not isinstance(report, dict):
            raise BadRequest(f"{where}: expected an object with function, start, seconds, count")
        counts.extend(_spread(report, where, now))
    return counts


def _spread(report: dict[str, Any], where: str, now: datetime) -> list[Count]:
    function = report.get("function")
    if not isinstance(function, str) or not convert.FUNCTION.fullmatch(function):
        raise BadRequest(
            f"{where}.function: expected 'namespace/service' (Kubernetes names), got {function!r:.200}"
        )
    count, seconds = report.get("count"), report.get("seconds", 60)
    if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= MAX_COUNT:
        raise BadRequest(f"{where}.count: expected an integer 0..{MAX_COUNT}, got {count!r}")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= MAX_WINDOW_S:
        raise BadRequest(f"{where}.seconds: expected 0 < seconds <= {MAX_WINDOW_S}, got {seconds!r}")
    start = _timestamp(report.get("start"), f"{where}.start")
    if start > now + FUTURE_SLACK or start < now - OLDEST:
        raise BadRequest(f"{where}.start: {start.isoformat()} is too far from now ({now.isoformat()})")
    first = int(start.timestamp() // 60)
    last = int(math.ceil((start.timestamp() + seconds) / 60)) - 1
    minutes = list(range(first, max(last, first) + 1))
    share, extra = divmod(count, len(minutes))
    spread = [share + (1 if i < extra else 0) for i in range(len(minutes))]
    return [Count(function, m, c) for m, c in zip(minutes, spread) if c]


def _timestamp(raw: object, where: str) -> datetime:
    if not isinstance(raw, str):
        raise BadRequest(f"{where}: expected an RFC 3339 timestamp")
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError as error:
        raise BadRequest(f"{where}: {raw!r} is not an RFC 3339 timestamp") from error
    if parsed.tzinfo is None:
        raise BadRequest(f"{where}: {raw!r} has no time zone")
    return parsed


async def receive(
    request: web.Request, sink: EventSink, *, max_body: int, timeout_s: float = 10.0
) -> web.Response:
    """The handler: parse, interpret, commit, answer (202 with an empty body)."""
    async with body_deadline(timeout_s):
        body = await _read_at_most(request, max_body)
    if body is None:
        metrics.events_rejected.add(1, {"http.response.status_code": 413})
        return web.json_response({"Error": f"event body larger than {max_body} bytes"}, status=413)
    try:
        return await _receive(request, body, sink)
    except BadRequest:
        metrics.events_rejected.add(1, {"http.response.status_code": 400})
        raise


async def _receive(request: web.Request, body: bytes, sink: EventSink) -> web.Response:
    events = parse(request.headers, body)
    now = datetime.fromtimestamp(sink.clock(), tz=UTC)
    via = Delivery(namespace=request.query.get("namespace"), broker=request.query.get("broker"))
    batches: list[tuple[tuple[str, str] | None, Effect]] = []
    for event in events:
        _check_key(event)
        metrics.events_received.add(1, {"cloudevents.event_type": metrics.event_types(event.get_type())})
        with _event_span(event):
            batches.append(((event.get_source(), event.get_id()), _effect_of(event, sink, now, via)))
    try:
        if any(effect for _, effect in batches):
            fresh = await sink.commit([b for b in batches if b[1]])
            metrics.events_duplicates.add(fresh.count(False))
    except QueueFull:
        metrics.events_rejected.add(1, {"http.response.status_code": 429})
        return web.Response(status=429, headers={"Retry-After": "1"})
    return web.Response(status=202)


async def _read_at_most(request: web.Request, limit: int) -> bytes | None:
    """The whole body, or None as soon as it is known to exceed `limit`."""
    if request.content_length is not None and request.content_length > limit:
        return None
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _check_key(event: BaseCloudEvent) -> None:
    """The (source, id) the history deduplicates by: text SQLite can store, of a sane length;
    and the type, text too, since it labels metrics."""
    for name, value in (("source", event.get_source()), ("id", event.get_id()), ("type", event.get_type())):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(f"CloudEvent {name} is not valid UTF-8") from None
        if name != "type" and len(value) > MAX_KEY_LENGTH:
            raise BadRequest(f"CloudEvent {name} is longer than {MAX_KEY_LENGTH} characters")


@dataclass(frozen=True, slots=True)
class Delivery:
    """Which Broker delivered the request, from the plugin's Trigger subscriber URI
    (`/events?namespace=NS&broker=NAME`); None matches Triggers of any."""

    namespace: str | None
    broker: str | None


def _effect_of(event: BaseCloudEvent, sink: EventSink, now: datetime, via: Delivery) -> Effect:
    if event.get_type() == INVOCATIONS:
        return Effect(counts=invocation_counts(event, now=now))
    if event.get_type().startswith(lifecycle.PREFIX):
        return lifecycle.effect(event.get_type(), event.get_data(), now=now.timestamp())
    event_attributes = attributes_of(event.get_attributes())
    functions = sink.triggers.functions_for(event_attributes, namespace=via.namespace, broker=via.broker)
    if functions:
        when = event.get_time() or now
        if not now - OLDEST <= when <= now + FUTURE_SLACK:
            when = now  # a sender's clock far off: the delivery time is the better guess
        minute = int(when.timestamp() // 60)
        return Effect(counts=[Count(function, minute, 1) for function in functions])
    event_type = metrics.event_types(event.get_type())  # bounded: 100 types, then "other"
    sink.unknown_types[event_type] += 1
    metrics.events_unknown.add(1, {"cloudevents.event_type": event_type})
    logger.debug(
        "CloudEvent of type %s from %s invokes no known function", event.get_type(), event.get_source()
    )
    return Effect()


def _event_span(event: BaseCloudEvent) -> Any:
    """A span per event, continuing the trace of its `traceparent` extension when present."""
    parent = context.get_current()
    traceparent = event.get_extension("traceparent")
    if isinstance(traceparent, str):
        parent = TraceContextTextMapPropagator().extract({"traceparent": traceparent})
    attributes = {
        "cloudevents.event_id": event.get_id(),
        "cloudevents.event_source": event.get_source(),
        "cloudevents.event_spec_version": "1.0",
        "cloudevents.event_type": event.get_type(),
    }
    subject = event.get_subject()
    if subject:
        attributes["cloudevents.event_subject"] = subject
    return tracer.start_as_current_span(
        f"{event.get_type()} process", context=parent, kind=trace.SpanKind.CONSUMER, attributes=attributes
    )
