"""A placement model that changes on disk serves without a restart.

With the `onnx` policy, `kdrl serve` looks at its model file every `KDRL_MODEL_RELOAD_S`
seconds, and at once on SIGHUP. A file whose size or modification time changed is loaded and
probed as at start; the extender serves it from its next call, and `/readyz` and every span
name its hash (`model`, `kdrl.policy.model`). A file that fails to load (missing, corrupt,
another feature schema) leaves the serving model in place: logged, counted
(`kdrl_model_reloads_total{kdrl_outcome="failed"}`) and said in `/readyz` (`model_reload`)
until a good file replaces it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from plugin import metrics
from plugin.extender import Extender
from policies.onnx_policy import LoadedPolicy

logger = logging.getLogger(__name__)


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        status = path.stat()
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size


class ModelReloader:
    def __init__(
        self, extender: Extender, path: Path, load: Callable[[], LoadedPolicy], *, interval_s: float
    ) -> None:
        self.extender, self.path, self.load, self.interval_s = extender, path, load, interval_s
        self.error = ""  # why the last changed file was refused; empty once one serves
        self.checked_at = 0.0
        self._stamp = _stamp(path)
        self._asked = asyncio.Event()

    def describe(self) -> dict[str, Any]:
        return {"path": str(self.path), "error": self.error, "checked_at": round(self.checked_at, 3)}

    def ask(self) -> None:
        """Check now (SIGHUP), whatever the file's stamp says."""
        self._asked.set()

    async def check(self, *, forced: bool = False) -> bool:
        """Load the file if it changed (or `forced`); True when a new model now serves."""
        self.checked_at = time.time()
        stamp = _stamp(self.path)
        if stamp == self._stamp and not forced:
            return False
        self._stamp = stamp
        loaded = await asyncio.to_thread(self.load)  # a session's creation is not the loop's work
        if loaded.degraded:
            self.error = loaded.degraded
            metrics.model_reloads.add(1, {"kdrl.outcome": "failed"})
            logger.error("model %s not reloaded, %s serves on: %s", self.path, self._serving(), self.error)
            return False
        self.error = ""
        if loaded.model == self.extender.loaded.model:
            return False
        logger.info("model reloaded: %s now serves (was %s)", loaded.model, self._serving())
        self.extender.use(loaded)
        metrics.model_reloads.add(1, {"kdrl.outcome": "reloaded"})
        return True

    def _serving(self) -> str:
        return self.extender.loaded.model or self.extender.loaded.policy.name

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):  # no signals off the main thread
            loop.add_signal_handler(signal.SIGHUP, self.ask)
        try:
            while True:
                timeout = self.interval_s if self.interval_s > 0 else None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._asked.wait(), timeout)
                forced = self._asked.is_set()
                self._asked.clear()
                try:
                    await self.check(forced=forced)
                except Exception:  # never the end of serving: the next change tries again
                    logger.exception("model reload check failed")
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGHUP)
