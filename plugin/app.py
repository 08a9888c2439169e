"""The aiohttp application: one factory, typed state in `keys`, lifetimes in `cleanup_ctx`.

Routes: the extender verbs under `/scheduler`, `/healthz` (the process answers) and
`/readyz` (the cluster cache has synced once; its detail says how stale it is), `/metrics`,
the CloudEvents sink, read-only `/debug/*` JSON and the decision explorer at `/ui` (static
files that read those JSON endpoints). Handlers are thin: parse, delegate, answer. Errors are
mapped to HTTP once, in `_errors`; every request's duration is measured once, in `_measured`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import math
import socket
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from functools import partial
from pathlib import Path
from typing import Any

import prometheus_client
from aiohttp import web
from kubernetes.aio.client import ApiClient

from forecaster import history
from forecaster.forecasting import Engine, Forecaster, LocalEngine
from forecaster.history import HistoryStore, Lifecycle, MinuteCounts
from forecaster.phase import Scores
from plugin import audiences, events, informer, kube, metrics, objectfiles, webhook, wire
from plugin.cleanup import serving_supports_revision_min_scale
from plugin.cluster import ClusterCache
from plugin.decision_recorder import DecisionRecorder
from plugin.decisions import RECENT
from plugin.emitter import Emitter
from plugin.errors import BadRequest, SettingsError, SlowRequest, body_deadline
from plugin.events import EventSink
from plugin.extender import Binder, Extender, KubeBinder, OfflineBinder
from plugin.forecasts import ForecastLoop
from plugin.functions import FunctionCatalog
from plugin.informer import WatchSettings
from plugin.keys import (
    AUDIENCES,
    CACHE,
    EVENTS,
    EXTENDER,
    FORECASTS,
    PREWARM,
    RECORDER,
    RELOADER,
    SETTINGS,
)
from plugin.leader import LeaderElector
from plugin.model_reload import ModelReloader
from plugin.prewarm_loop import PrewarmLoop
from plugin.prewarming import Prepuller, RevisionActuator
from plugin.settings import Settings
from policies import onnx_policy, registry
from policies.decision_records import DecisionStore
from prewarm.planning import Budget, PlannerSettings, cold_start_estimate, plan_json

logger = logging.getLogger(__name__)

EXTENDER_PREFIX = "/scheduler"  # the urlPrefix path of protocols.md §1.4
UI_FILES = Path(__file__).resolve().parent / "ui"
SAMPLE_EVERY_S = 10.0  # state gauges for push exporters (a scrape samples them itself)
DECODE_INLINE_BYTES = 256 * 1024  # names-only extender calls stay far below: decoded inline
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def create_app(settings: Settings, *, api: ApiClient | None = None) -> web.Application:
    """The service. Offline when `settings.kube.nodes_file` is set; else it watches `api`
    (or a client made from the settings), which it closes on cleanup."""
    app = web.Application(
        client_max_size=settings.server.max_body_bytes, middlewares=[_audience, _measured, _errors]
    )
    binder: Binder
    if settings.offline:
        assert settings.kube.nodes_file is not None
        nodes = objectfiles.load(settings.kube.nodes_file)
        pods = objectfiles.load(settings.kube.pods_file) if settings.kube.pods_file else []
        cache = ClusterCache.from_objects(nodes, pods)
        binder = OfflineBinder()
    else:
        api = api or await kube.connect(api_url=settings.kube.api_url, kubeconfig=settings.kube.kubeconfig)
        watch = WatchSettings(
            list_timeout_s=settings.kube.request_timeout_s * 6,
            watch_timeout_s=settings.kube.watch_timeout_s,
            backoff_max_s=settings.kube.backoff_max_s,
        )
        cache = ClusterCache(api=api, settings=watch)
        binder = KubeBinder(api=api, timeout_s=settings.kube.request_timeout_s)
    chosen = settings.policy
    load = partial(
        registry.load,
        chosen.name,
        seed=chosen.seed,
        model=chosen.model,
        device=chosen.device,
        threads=chosen.threads,
    )
    loaded = load()
    app[SETTINGS] = settings
    app[CACHE] = cache
    app[EXTENDER] = Extender(cache=cache, policy=loaded, binder=binder)
    if chosen.name == "onnx":
        path = chosen.model or onnx_policy.DEFAULT_MODEL
        app[RELOADER] = ModelReloader(app[EXTENDER], path, load, interval_s=chosen.reload_s)
        app.cleanup_ctx.append(_background(app[RELOADER].run, "model-reload"))
    metrics.start_counters(loaded.policy.name)
    app[EVENTS] = sink = _event_sink(settings)
    if settings.history.record_decisions:
        app[RECORDER] = recorder = DecisionRecorder(
            settings.history.path,
            retention_s=settings.history.decisions_retention_h * 3600.0,
            max_rows=settings.history.decisions_max_rows,
            max_per_s=settings.history.decisions_max_per_s,
        )
        app[EXTENDER].on_bound = recorder.served
        sink.observers.append(recorder.observed)
        app.cleanup_ctx.append(_background(recorder.run, "decision-records"))
    app[FORECASTS] = ForecastLoop(
        forecaster=Forecaster(sink.counts, engine=_engine(settings)), clock=time.time
    )
    # Cleanups run in reverse: the API client and the history close after their users stop.
    app.cleanup_ctx.append(_background(cache.run, "cluster-cache", then=api.close if api else None))
    app.cleanup_ctx.append(_background(sink.run, "event-commits", then=sink.close))
    app.cleanup_ctx.append(_background(app[FORECASTS].run, "forecasts"))
    app.cleanup_ctx.append(_background(partial(events.compact_forever, sink), "history-compaction"))
    app.cleanup_ctx.append(_background(partial(_sample_forever, app), "metrics-sampling"))
    if api is not None:
        follow_triggers = partial(informer.follow, kube.triggers(api), sink.triggers, watch)
        app.cleanup_ctx.append(_background(follow_triggers, "triggers"))
        if settings.prewarm.enabled:
            _prewarming(app, api, settings, watch)
    app.add_routes(
        [
            web.post(f"{EXTENDER_PREFIX}/filter", _filter),
            web.post(f"{EXTENDER_PREFIX}/prioritize", _prioritize),
            web.post(f"{EXTENDER_PREFIX}/bind", _bind),
            web.get("/healthz", _healthz),
            web.get("/readyz", _readyz),
            web.get("/metrics", _metrics),
            web.post("/events", _events),
            web.post("/mutate-pods", _mutate_pods),
            web.post("/", _events),
            web.get("/debug/functions", _functions),
            web.get("/debug/prewarm", _prewarm_plan),
            web.get("/debug/functions/{namespace}/{service}", _function),
            web.get("/debug/decisions", _decisions),
            web.get("/debug/decisions/export", _export_decisions),
            web.get("/ui", _ui),
            web.static("/ui/static", UI_FILES),
        ]
    )
    return app


def _prewarming(app: web.Application, api: ApiClient, settings: Settings, watch: WatchSettings) -> None:
    """Services and Knative's image cache objects watched into a catalog, a Lease, and the
    plan-every-minute loop that the leader applies (restoring what it changed when the app
    stops)."""
    config, timeout = settings.prewarm, settings.kube.request_timeout_s
    sink, cache, forecasts = app[EVENTS], app[CACHE], app[FORECASTS]
    catalog = FunctionCatalog(observed=lambda f: sink.lifecycle.cold_starts_s.get(f, []))
    sink.counts.keep = lambda function: function in catalog.services.items  # Knative's: never evicted
    elector = LeaderElector(
        api,
        namespace=config.namespace,
        name=config.lease,
        me=config.identity or socket.gethostname(),
        timeout_s=timeout,
    )
    actuator = RevisionActuator(api, timeout_s=timeout, shadow=config.shadow)
    loop = app[PREWARM] = PrewarmLoop(
        catalog=catalog,
        forecasts=lambda: forecasts.latest,
        nodes=lambda: cache.snapshot.nodes,
        policy=lambda: app[EXTENDER].loaded.policy,
        actuator=actuator,
        prepuller=Prepuller(api, namespace=config.namespace, timeout_s=timeout, shadow=config.shadow),
        budget=Budget(int(config.warm_memory_gib * (1 << 30)), config.pulls_per_minute),
        leading=lambda: elector.leading,
        clock=time.time,
        settings=PlannerSettings(
            window_minutes=config.window_minutes,
            hybrid_memory_share=config.hybrid_memory_share or None,
            scale_down_utilization=config.scale_down_utilization,
            gpu_price_per_hour=config.gpu_price_per_hour,
        ),
        emitter=Emitter(config.sink) if config.sink else None,
        forecast_context=lambda: forecasts.context,
        invoked=lambda function, minute: _invoked_since(sink, function, minute),
        keep_scores=lambda judged: sink.on_store(partial(sink.store.keep_answer_losses, judged)),
    )

    async def plan_forever() -> None:
        try:  # which answer each function had earned before a restart
            loop.scores = Scores.resumed(await sink.on_store(sink.store.answer_losses))
        except Exception as error:  # a damaged table: the losses start afresh
            logger.warning("could not read the kept answer losses (%s); starting afresh", error)
        if not config.shadow:
            supported, found = await serving_supports_revision_min_scale(api, timeout_s=timeout)
            logger.log(logging.INFO if supported else logging.WARNING, "prewarm: %s", found)
            actuator.shadow = loop.prepuller.shadow = not supported
        await loop.run()

    for collection, store in (
        (kube.services(api), catalog.services),
        (kube.knative_images(api), catalog.images),
    ):
        follow = partial(informer.follow, collection, store, watch)
        app.cleanup_ctx.append(_background(follow, collection.name))
    # Cleanup runs in reverse: the prewarm loop stops (and restores) first, then the lease is
    # released, so no successor acts while this replica still undoes its changes.
    app.cleanup_ctx.append(_background(elector.run, "leader-election", then=elector.release))
    keep = config.keep_on_shutdown
    app.cleanup_ctx.append(_background(plan_forever, "prewarm", then=partial(loop.shutdown, keep=keep)))


def _invoked_since(sink: EventSink, function: str, minute: int) -> bool:
    """Whether `function` has invocations recorded from `minute` on (within the last two days)."""
    end = int(sink.clock() // 60) + 1
    return bool(sink.counts.series(function, end, min(max(end - minute, 1), 2 * 24 * 60)).any())


def _engine(settings: Settings) -> Engine:
    """Where forecast cycles run (`KDRL_FORECAST_ENGINE`)."""
    history = settings.history
    if history.forecast_engine == "local":
        return LocalEngine()
    if not history.ray_address:
        raise SettingsError("KDRL_FORECAST_ENGINE=ray needs KDRL_RAY_ADDRESS (the Ray cluster's address)")
    if importlib.util.find_spec("ray") is None:
        raise SettingsError("KDRL_FORECAST_ENGINE=ray needs Ray: pip install 'knative-drl-scheduler[ray]'")
    from plugin.ray_engine import RayEngine  # Ray is imported only where it is used

    return RayEngine(history.ray_address)


def _event_sink(settings: Settings) -> EventSink:
    """The history from its database (the last two days back in memory) and its sink."""
    store = HistoryStore(settings.history.path)
    counts = MinuteCounts(capacity=settings.history.max_functions)
    rows = history.rebuild(store, counts, now_minute=int(time.time() // 60))
    pods = Lifecycle(max_functions=settings.history.max_functions)
    pods.apply(store.lifecycle(since=time.time() - 2 * 86400))
    logger.info(
        "history %s: %d minute rows, %d functions", settings.history.path, rows, len(counts.functions)
    )
    limit = settings.history.events_max_pending
    return EventSink(store=store, counts=counts, lifecycle=pods, clock=time.time, max_pending=limit)


def _background(
    job: Callable[[], Coroutine[Any, Any, None]],
    name: str,
    *,
    then: Callable[[], Awaitable[None]] | None = None,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """A task that lives as long as the app: started at startup, cancelled at cleanup, and
    `then` awaited after it has stopped (to close what it used)."""

    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(job(), name=name)
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if then is not None:
            await then()

    return lifetime


async def _events(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    return await events.receive(
        request,
        request.app[EVENTS],
        max_body=settings.history.events_max_body_bytes,
        timeout_s=settings.server.body_timeout_s,
    )


async def _mutate_pods(request: web.Request) -> web.Response:
    """The admission webhook (`plugin.webhook`): Knative pods to the kdrl scheduler."""
    return web.json_response(webhook.review(await _decoded(request)))


async def _prewarm_plan(request: web.Request) -> web.Response:
    """The latest prewarm plan with its reasons (the shadow mode's record)."""
    loop = request.app.get(PREWARM)
    if loop is None:  # an answer, not an error: the explorer shows it as the state it is
        return web.json_response(
            {"enabled": False, "why": "prewarming is off (offline mode or KDRL_PREWARM=false)"}
        )
    latest = loop.latest
    return web.json_response(
        {
            "enabled": True,
            "shadow": loop.actuator.shadow,
            "leader": loop.leading(),
            "warmed": sorted(loop.warmed),
            "plan": None if latest is None else plan_json(latest),
        }
    )


async def _functions(request: web.Request) -> web.Response:
    """Every function with recorded invocations, and each one's idle-time class (`idletimes`)
    where the latest forecast cycle saw it."""
    latest = request.app[FORECASTS].latest
    return web.json_response(
        {
            "functions": sorted(request.app[EVENTS].counts.functions),
            "patterns": {f: forecast.pattern.value for f, forecast in sorted(latest.items())},
        }
    )


async def _function(request: web.Request) -> web.Response:
    """One function's per-minute counts over the last hours (`?hours=`, default 6)."""
    function = f"{request.match_info['namespace']}/{request.match_info['service']}"
    sink = request.app[EVENTS]
    if function not in sink.counts.functions and function not in sink.lifecycle.routes:
        return web.json_response({"Error": f"no invocations recorded for {function}"}, status=404)
    try:
        hours = float(request.query.get("hours", "6"))
    except ValueError:
        hours = math.nan
    if not math.isfinite(hours):
        raise BadRequest(f"hours={request.query['hours']!r} is not a finite number")
    hours = min(max(hours, 1 / 60), 48.0)
    minutes = int(hours * 60)
    end = int(sink.clock() // 60) + 1
    series = sink.counts.series(function, end, minutes)
    observed = sink.lifecycle.cold_starts_s.get(function, [])
    forecast = request.app[FORECASTS].latest.get(function)
    return web.json_response(
        {
            "function": function,
            "end_minute": end,
            "minutes": minutes,
            "counts": series.tolist(),
            "routed_revision": sink.lifecycle.routes.get(function),
            "running_pods": sink.lifecycle.running(function),
            "observed_cold_starts_s": [round(s, 3) for s in observed],
            # what the prewarm planner prices a cold start of this function at
            "cold_start_estimate_s": round(cold_start_estimate(observed), 3),
            "forecast": forecast.as_json() if forecast else None,
        }
    )


async def _decoded(request: web.Request) -> Any:
    """The JSON body. A big one (full Node objects) is decoded on a worker thread: tens of
    megabytes take the better part of a second, which on the event loop would stall every
    other request, the CloudEvents sink's included."""
    async with body_deadline(request.app[SETTINGS].server.body_timeout_s):
        body = await request.read()
    if len(body) < DECODE_INLINE_BYTES:
        return wire.decode(body)
    return await asyncio.get_running_loop().run_in_executor(None, wire.decode, body)


async def _filter(request: web.Request) -> web.Response:
    started = time.perf_counter()
    args = wire.parse_extender_args(await _decoded(request))
    decoded = time.perf_counter()
    result = request.app[EXTENDER].filter(args)
    decided = time.perf_counter()
    return _timed(web.json_response(result), started, decode=decoded, decide=decided)


async def _prioritize(request: web.Request) -> web.Response:
    started = time.perf_counter()
    args = wire.parse_extender_args(await _decoded(request))
    decoded = time.perf_counter()
    priorities = request.app[EXTENDER].prioritize(args)
    decided = time.perf_counter()
    body = priorities.encode()
    response = web.Response(body=body, content_type="application/json")
    return _timed(response, started, decode=decoded, decide=decided)


async def _bind(request: web.Request) -> web.Response:
    started = time.perf_counter()
    args = wire.parse_binding_args(await _decoded(request))
    decoded = time.perf_counter()
    result = await request.app[EXTENDER].bind(args)
    bound = time.perf_counter()
    return _timed(web.json_response(result), started, decode=decoded, bind=bound)


def _timed(response: web.Response, started: float, **ends: float) -> web.Response:
    """A W3C `Server-Timing` header: each phase's milliseconds (the phases run in order, the
    last one until now, which is the answer's encoding), for proxies, browsers and benchmarks."""
    phases, previous = [], started
    for phase, end in [*ends.items(), ("encode", time.perf_counter())]:
        phases.append(f"{phase};dur={(end - previous) * 1000:.3f}")
        previous = end
    response.headers["Server-Timing"] = ", ".join(phases)
    return response


async def _decisions(request: web.Request) -> web.Response:
    """The latest placement decisions, newest first (`?limit=`, default 50, at most RECENT)."""
    raw = request.query.get("limit", "50")
    if not raw.isdigit():
        raise BadRequest(f"limit={raw!r} is not a non-negative integer")
    extender = request.app[EXTENDER]
    recent = extender.decisions.recent(min(int(raw[:6]), RECENT))
    return web.json_response(
        {
            "policy": extender.loaded.describe(),
            "decisions": [decision.as_json(extender.policy) for decision in recent],
        }
    )


async def _export_decisions(request: web.Request) -> web.Response:
    """The recorded decisions of the last `?hours=` (default: all kept), with their outcomes,
    as a SQLite file: what `kdrl loop` fetches to learn from."""
    if RECORDER not in request.app:
        return web.json_response({"Error": "decision recording is off (KDRL_DECISIONS_RECORD)"}, status=404)
    raw = request.query.get("hours", "")
    if raw and not raw.replace(".", "", 1).isdigit():
        raise BadRequest(f"hours={raw!r} is not a non-negative number")
    recorder = request.app[RECORDER]
    since = time.time() - float(raw) * 3600.0 if raw else 0.0

    def export() -> bytes:
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "decisions.db"
            store = DecisionStore(request.app[SETTINGS].history.path)
            try:
                store.export(path, since=since)
            finally:
                store.close()
            return path.read_bytes()

    await recorder.flush_soon()  # what waits for a flush is in the file too
    body = await asyncio.to_thread(export)
    return web.Response(body=body, content_type="application/vnd.sqlite3")


async def _ui(request: web.Request) -> web.FileResponse:
    """The decision explorer: one static page reading the `/debug/*` endpoints."""
    return web.FileResponse(UI_FILES / "index.html")


def _sample(app: web.Application) -> None:
    """Set the gauges of current state: the cluster cache, the policy, the event queue, the
    functions held in memory."""
    cache = app[CACHE]
    snapshot = cache.snapshot
    metrics.cache_age.set(snapshot.age(cache.clock()))
    metrics.cache_nodes.set(len(snapshot.nodes))
    loaded = app[EXTENDER].loaded
    metrics.policy_fallback.set(1 if loaded.degraded else 0, {"kdrl.policy": app[SETTINGS].policy.name})
    sink = app[EVENTS]
    metrics.events_queue.set(sink.pending)
    metrics.history_functions.set(len(sink.counts))
    metrics.history_forgotten.total(sink.counts.evicted, {"kdrl.reason": "evicted"})
    metrics.history_forgotten.total(sink.counts.refused, {"kdrl.reason": "refused"})


async def _sample_forever(app: web.Application) -> None:
    while True:
        _sample(app)
        await asyncio.sleep(SAMPLE_EVERY_S)


async def _metrics(request: web.Request) -> web.Response:
    """Prometheus text format, from the OpenTelemetry Prometheus reader set up by `serve`."""
    _sample(request.app)
    return web.Response(
        body=prometheus_client.generate_latest(),
        headers={"Content-Type": prometheus_client.CONTENT_TYPE_LATEST},
    )


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _readyz(request: web.Request) -> web.Response:
    cache = request.app[CACHE]
    snapshot = cache.snapshot
    detail: dict[str, Any] = {
        "ready": snapshot.synced,
        "mode": "offline" if cache.offline else "watch",
        "nodes": len(snapshot.nodes),
        "snapshot_age_s": round(snapshot.age(cache.clock()), 3),
        **request.app[EXTENDER].loaded.describe(),
    }
    if RELOADER in request.app:  # a changed model file that failed to load says so here
        detail["model_reload"] = request.app[RELOADER].describe()
    if detail["degraded"]:
        detail["status"] = "degraded"  # still ready: the fallback policy serves
    return web.json_response(detail, status=200 if snapshot.synced else 503)


@web.middleware
async def _audience(request: web.Request, handler: Handler) -> web.StreamResponse:
    """404 for a route that is not this port's audience's (`audiences`): a caller admitted to
    one port reaches nothing else through it."""
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    port = sockname[1] if isinstance(sockname, tuple) and len(sockname) >= 2 else None
    if not audiences.allowed(request.app.get(AUDIENCES), port, request.path):
        return web.json_response({"Error": f"{request.path} is not served on this port"}, status=404)
    return await handler(request)


@web.middleware
async def _measured(request: web.Request, handler: Handler) -> web.StreamResponse:
    """`http.server.request.duration` of every request, by method, route template and status;
    extender routes also by policy."""
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as error:
        status = error.status
        raise
    finally:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else "unmatched"
        attributes: dict[str, str | int] = {
            "http.request.method": request.method if request.method in _METHODS else "_OTHER",
            "http.route": route,
            "http.response.status_code": status,
        }
        if route.startswith(EXTENDER_PREFIX):
            attributes["kdrl.policy"] = request.app[EXTENDER].policy.name
        metrics.soon(metrics.http_duration.record, time.perf_counter() - started, attributes)


_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Protocol errors -> 400, slow bodies -> 408, oversized ones -> 413, bugs -> 500; all with
    a JSON `Error`."""
    try:
        return await handler(request)
    except BadRequest as error:
        logger.info("%s %s: 400: %s", request.method, request.path, error)
        return web.json_response({"Error": str(error)}, status=400)
    except web.RequestPayloadError as error:  # e.g. Content-Encoding: gzip on a body that is not
        logger.info("%s %s: 400: unreadable body: %s", request.method, request.path, error)
        response = web.json_response({"Error": f"request body could not be read: {error}"}, status=400)
        # The connection closes after this answer; the body ends here, so aiohttp does not read
        # on after it (and log the same error again as an unhandled exception).
        response.force_close()
        request.content.feed_eof()
        return response
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[SETTINGS].server.max_body_bytes
        return web.json_response({"Error": f"request body larger than {limit} bytes"}, status=413)
    except SlowRequest as error:
        logger.info("%s %s: 408: %s", request.method, request.path, error)
        response = web.json_response({"Error": str(error)}, status=408)
        response.force_close()  # the rest of the body is not worth waiting for
        return response
    except web.HTTPException:
        raise
    except Exception as error:
        logger.exception("%s %s failed", request.method, request.path)
        return web.json_response({"Error": f"internal error: {type(error).__name__}"}, status=500)
