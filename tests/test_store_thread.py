"""The thread that owns a SQLite connection (`plugin/store_thread.py`): close never runs under
a job still on the thread, even one whose waiter was cancelled."""

from __future__ import annotations

import asyncio
import threading

import pytest

from plugin.store_thread import StoreThread


def slow_job(order: list[str], started: threading.Event, release: threading.Event) -> str:
    order.append("job begins")
    started.set()
    release.wait(10)
    order.append("job ends")
    return "done"


@pytest.mark.parametrize("closing", ["close", "aclose"])
async def test_close_waits_for_a_job_whose_waiter_was_cancelled(closing: str) -> None:
    thread, order = StoreThread("test"), []
    started, release = threading.Event(), threading.Event()
    waiting = thread.run(lambda: slow_job(order, started, release))
    assert await asyncio.to_thread(started.wait, 10)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    threading.Timer(0.2, release.set).start()  # the job ends while close waits
    if closing == "close":
        await asyncio.to_thread(thread.close, lambda: order.append("close"))
    else:
        await thread.aclose(lambda: order.append("close"))
    assert order == ["job begins", "job ends", "close"]


async def test_jobs_run_in_order_and_return_their_results() -> None:
    thread, order = StoreThread("test"), []
    first = thread.run(lambda: order.append("first") or 1)
    assert thread.call(lambda: order.append("second") or 2) == 2
    assert await first == 1
    assert order == ["first", "second"]
    thread.close(lambda: None)


async def test_a_cancelled_wait_drops_its_job_only_if_it_has_not_started() -> None:
    thread, order = StoreThread("test"), []
    started, release = threading.Event(), threading.Event()
    running = thread.run(lambda: slow_job(order, started, release))
    queued = thread.run(lambda: order.append("queued job"))
    assert await asyncio.to_thread(started.wait, 10)
    running.cancel()
    queued.cancel()
    await asyncio.sleep(0)  # the loop hands the cancellation on to the thread's queue
    release.set()
    await thread.aclose(lambda: order.append("close"))
    assert order == ["job begins", "job ends", "close"]
