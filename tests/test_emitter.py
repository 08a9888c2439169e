"""CloudEvents about applied changes, to a sink over real HTTP; a failing sink costs a warning."""

from __future__ import annotations

import json

from aiohttp import web
from aiohttp.test_utils import TestServer

from plugin.emitter import Emitter


async def test_a_change_arrives_as_a_binary_cloudevent() -> None:
    received: list[tuple[dict[str, str], bytes]] = []

    async def sink(request: web.Request) -> web.Response:
        received.append((dict(request.headers), await request.read()))
        return web.Response(status=202)

    app = web.Application()
    app.router.add_post("/", sink)
    async with TestServer(app) as server:
        emitter = Emitter(str(server.make_url("/")))
        assert await emitter.emit("warm", "shop/hello-00002", {"replicas": 2})
        await emitter.close()
    ((headers, body),) = received
    assert headers["ce-type"] == "dev.kdrl.prewarm.warm" and headers["ce-specversion"] == "1.0"
    assert headers["ce-subject"] == "shop/hello-00002" and headers["ce-id"]
    assert json.loads(body) == {"replicas": 2}


async def test_an_unreachable_or_refusing_sink_is_counted_not_raised() -> None:
    async def refuse(request: web.Request) -> web.Response:
        return web.Response(status=500)

    app = web.Application()
    app.router.add_post("/", refuse)
    async with TestServer(app) as server:
        emitter = Emitter(str(server.make_url("/")))
        assert not await emitter.emit("restore", "shop/hello-00002", {})
        await emitter.close()
    gone = Emitter("http://127.0.0.1:9/", timeout_s=1.0)  # nothing listens on the discard port
    assert not await gone.emit("restore", "shop/hello-00002", {})
    await gone.close()
    assert emitter.failed == 1 and gone.failed == 1
