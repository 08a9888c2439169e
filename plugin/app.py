"""The aiohttp application: one factory, typed state in `keys`, lifetimes in `cleanup_ctx`.

Routes: the extender verbs under `/scheduler`, `/healthz` (the process answers) and
`/readyz` (the cluster cache has synced once; its detail says how stale it is). Handlers
are thin: parse, delegate, answer. Errors are mapped to HTTP once, in `_errors`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web
from kubernetes.aio.client import ApiClient

from plugin import kube, objectfiles, wire
from plugin.cluster import ClusterCache, WatchSettings
from plugin.errors import BadRequest
from plugin.extender import Binder, Extender, KubeBinder, OfflineBinder
from plugin.keys import CACHE, EXTENDER, SETTINGS
from plugin.settings import Settings
from policies import heuristics

logger = logging.getLogger(__name__)

EXTENDER_PREFIX = "/scheduler"  # the urlPrefix path of protocols.md §1.4
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def create_app(settings: Settings, *, api: ApiClient | None = None) -> web.Application:
    """The service. Offline when `settings.kube.nodes_file` is set; else it watches `api`
    (or a client made from the settings), which it closes on cleanup."""
    app = web.Application(client_max_size=settings.server.max_body_bytes, middlewares=[_errors])
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
    policy = heuristics.by_name(settings.policy.name, seed=settings.policy.seed)
    app[SETTINGS] = settings
    app[CACHE] = cache
    app[EXTENDER] = Extender(cache=cache, policy=policy, binder=binder)
    app.cleanup_ctx.append(_cluster_watch(cache, api))
    app.add_routes(
        [
            web.post(f"{EXTENDER_PREFIX}/filter", _filter),
            web.post(f"{EXTENDER_PREFIX}/prioritize", _prioritize),
            web.post(f"{EXTENDER_PREFIX}/bind", _bind),
            web.get("/healthz", _healthz),
            web.get("/readyz", _readyz),
        ]
    )
    return app


def _cluster_watch(
    cache: ClusterCache, api: ApiClient | None
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(cache.run(), name="cluster-cache")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if api is not None:
            await api.close()

    return lifetime


async def _filter(request: web.Request) -> web.Response:
    args = wire.parse_extender_args(wire.decode(await request.read()))
    return web.json_response(request.app[EXTENDER].filter(args))


async def _prioritize(request: web.Request) -> web.Response:
    args = wire.parse_extender_args(wire.decode(await request.read()))
    body = request.app[EXTENDER].prioritize(args).encode()
    return web.Response(body=body, content_type="application/json")


async def _bind(request: web.Request) -> web.Response:
    args = wire.parse_binding_args(wire.decode(await request.read()))
    return web.json_response(await request.app[EXTENDER].bind(args))


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _readyz(request: web.Request) -> web.Response:
    cache = request.app[CACHE]
    snapshot = cache.snapshot
    detail = {
        "ready": snapshot.synced,
        "mode": "offline" if cache.offline else "watch",
        "nodes": len(snapshot.nodes),
        "snapshot_age_s": round(snapshot.age(cache.clock()), 3),
        "policy": request.app[EXTENDER].policy.name,
    }
    return web.json_response(detail, status=200 if snapshot.synced else 503)


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Protocol errors -> 400, oversized bodies -> 413, bugs -> 500; all with a JSON `Error`."""
    try:
        return await handler(request)
    except BadRequest as error:
        logger.info("%s %s: 400: %s", request.method, request.path, error)
        return web.json_response({"Error": str(error)}, status=400)
    except web.HTTPRequestEntityTooLarge:
        limit = request.app[SETTINGS].server.max_body_bytes
        return web.json_response({"Error": f"request body larger than {limit} bytes"}, status=413)
    except web.HTTPException:
        raise
    except Exception as error:
        logger.exception("%s %s failed", request.method, request.path)
        return web.json_response({"Error": f"internal error: {type(error).__name__}"}, status=500)
