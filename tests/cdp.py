"""Headless Chromium driven over the Chrome DevTools Protocol, for the browser tests.

Debian's `chromium` package (Playwright's browser downloads do not work here); the protocol
runs over aiohttp's WebSocket client, so the tests need nothing beyond the service's own
dependencies. Console errors and uncaught exceptions are collected as they happen.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

BINARIES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    return next((path for name in BINARIES if (path := shutil.which(name))), None)


class Page:
    """One tab: commands by method name, events kept as they arrive."""

    def __init__(self, socket: aiohttp.ClientWebSocketResponse) -> None:
        self._socket = socket
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.errors: list[str] = []  # console errors, failed loads and uncaught exceptions
        self._reader = asyncio.create_task(self._read())

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        message_id = next(self._ids)
        answer = self._waiting[message_id] = asyncio.get_running_loop().create_future()
        await self._socket.send_json({"id": message_id, "method": method, "params": params})
        reply = await asyncio.wait_for(answer, timeout=30)
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    async def evaluate(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, *, timeout_s: float = 20.0) -> Any:
        """Poll until `expression` is truthy; its value."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if asyncio.get_running_loop().time() > deadline:
                text = await self.evaluate("document.body ? document.body.innerText : ''")
                raise AssertionError(f"timed out waiting for {expression}; the page shows:\n{text}")
            await asyncio.sleep(0.1)

    async def screenshot(self, path: Path) -> Path:
        shot = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path

    async def _read(self) -> None:
        async for message in self._socket:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            data = message.json()
            if "id" in data:
                waiting = self._waiting.pop(data["id"], None)
                if waiting is not None and not waiting.done():
                    waiting.set_result(data)
                continue
            self._note(data.get("method", ""), data.get("params", {}))

    def _note(self, method: str, params: dict[str, Any]) -> None:
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            self.errors.append(
                " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            )
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.errors.append(str(details.get("exception", {}).get("description") or details.get("text")))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            self.errors.append(f"{entry.get('text')} ({entry.get('url', '')})")


@contextlib.asynccontextmanager
async def chromium(binary: str) -> AsyncIterator[Page]:
    """A headless browser with one page, closed on exit."""
    profile = Path(tempfile.mkdtemp(prefix="kdrl-chromium-"))
    process = subprocess.Popen(
        [
            binary,
            "--headless=new",
            "--no-sandbox",  # CI runs as root in a container
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--remote-debugging-port=0",
            "--remote-allow-origins=*",
            f"--user-data-dir={profile}",
            "--window-size=1280,1400",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port = await _devtools_port(profile, process)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/json/list") as response:
                targets = await response.json()
            url = next(t["webSocketDebuggerUrl"] for t in targets if t.get("type") == "page")
            async with session.ws_connect(url, max_msg_size=0) as socket:
                page = Page(socket)
                for domain in ("Runtime", "Log", "Page"):
                    await page.send(f"{domain}.enable")
                yield page
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
        shutil.rmtree(profile, ignore_errors=True)


async def _devtools_port(profile: Path, process: subprocess.Popen[bytes]) -> int:
    """The port Chromium chose, from the file it writes into its profile."""
    marker = profile / "DevToolsActivePort"
    for _ in range(300):
        if process.poll() is not None:
            raise RuntimeError(f"chromium exited with {process.returncode}")
        if marker.exists() and marker.read_text().strip():
            return int(marker.read_text().splitlines()[0])
        await asyncio.sleep(0.1)
    raise RuntimeError("chromium did not open its DevTools port")
