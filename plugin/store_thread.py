"""One thread that owns a SQLite connection.

Every operation on the connection (writes, compaction, trimming, close) queues on this thread
behind the one before, so none overlaps another. That matters at shutdown: cancelling a task
that awaits a write cancels the wait, not the write, and closing a connection while a query
still runs on another thread crashes the interpreter.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class StoreThread:
    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=name)

    def run(self, job: Callable[[], T]) -> asyncio.Future[T]:
        """`job` queued on the thread now, to be awaited on the event loop. Cancelling the
        wait drops the job if it has not started by the loop's next turn; one already running
        goes on."""
        return asyncio.wrap_future(self._executor.submit(job))

    def call(self, job: Callable[[], T]) -> T:
        """`job` on the thread, waited for here (after whatever is queued before it)."""
        return self._executor.submit(job).result()

    def close(self, close_store: Callable[[], None]) -> None:
        """Close the store after whatever is running or queued on it, then the thread."""
        self.call(close_store)
        self._executor.shutdown(wait=True)

    async def aclose(self, close_store: Callable[[], None]) -> None:
        """`close`, awaited on an event loop."""
        await self.run(close_store)
        self._executor.shutdown(wait=True)  # nothing is left on it: returns at once
