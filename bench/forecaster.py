"""Forecaster speed and memory: ingest, one forecast cycle for 10,000 functions, history size.

    python -m bench.forecaster            # the table
    python -m bench.forecaster --json

- ingest through the HTTP sink: `kdrl serve` offline in a subprocess, 16 concurrent senders
  posting binary `dev.kdrl.invocations.v1` events, each acknowledged only after its commit;
- ingest into the history directly: counts per second through `MinuteCounts` and one
  `HistoryStore` transaction per 1,000;
- a forecast cycle for 10,000 functions, 30-minute horizon, after a warm-up (targets: <= 10 s),
  and the hourly model choice (backtest) that precedes it;
- memory of two days of minute history for 10,000 functions (target: <= 100 MB).
Histories are the shared Azure rows (first 12 hours, repeated to 10,000 functions) when the
trace is beside the repository, else seeded synthetic ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from cloudevents.core.bindings.http import to_binary_event
from cloudevents.core.v1.event import CloudEvent

from bench import extender as extender_bench
from bench.simulator import SHARED_TRACE
from forecaster.forecasting import Forecaster
from forecaster.history import MINUTES_KEPT, Count, Effect, HistoryStore, MinuteCounts
from simulator import traces

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "cluster"
FUNCTIONS = 10_000
END = 40_000_000  # a fixed "now" in minutes since the epoch (2046)


def histories(functions: int, minutes: int) -> np.ndarray:
    if (SHARED_TRACE / traces.INVOCATIONS).is_file():
        rows = traces.load(SHARED_TRACE).counts[:, :minutes]
        return rows[np.arange(functions) % len(rows)]
    rng = np.random.default_rng(0)
    rates = rng.lognormal(-2.0, 2.0, size=(functions, 1))
    return rng.poisson(np.broadcast_to(rates, (functions, minutes)))


def forecast_cycle() -> list[dict[str, Any]]:
    counts = MinuteCounts()
    data = histories(FUNCTIONS, 720)
    for i, row in enumerate(data):
        for minute in np.flatnonzero(row):
            counts.add(f"ns/f{i:05d}", END - 720 + int(minute), int(row[minute]))
    forecaster = Forecaster(counts)
    forecaster.forecast(END, horizon=30)  # warm-up: numba compiles here, not in the cycle
    started = time.perf_counter()
    forecaster.choose(END, horizon=30)
    chosen = time.perf_counter()
    forecasts = forecaster.forecast(END, horizon=30)
    done = time.perf_counter()
    models: dict[str, int] = {}
    for f in forecasts.values():
        models[f.model] = models.get(f.model, 0) + 1
    return [
        {
            "benchmark": f"model choice (backtest), {len(forecasts)} functions",
            "value": round(chosen - started, 2),
            "unit": "s",
            "target": "hourly, in the background",
        },
        {
            "benchmark": f"forecast cycle, {len(forecasts)} functions, 30 min",
            "value": round(done - chosen, 2),
            "unit": "s",
            "target": "<= 10 s",
            "met": done - chosen <= 10,
            "models": models,
        },
    ]


def memory() -> dict[str, Any]:
    tracemalloc.start()
    counts = MinuteCounts()
    for i in range(FUNCTIONS):
        counts.add(f"ns/f{i:05d}", END, 1)
        counts.add(f"ns/f{i:05d}", END - MINUTES_KEPT + 1, 1)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "benchmark": f"two days of minute history, {FUNCTIONS} functions (peak traced)",
        "value": round(peak / 2**20, 1),
        "unit": "MiB",
        "target": "<= 100 MB",
        "met": peak <= 100e6,
    }


def direct_ingest() -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        store, counts = HistoryStore(Path(folder) / "h.db"), MinuteCounts()
        total, started = 0, time.perf_counter()
        for batch in range(50):
            rows = [Count(f"ns/f{(batch * 1000 + i) % FUNCTIONS:05d}", END - batch, 1) for i in range(1000)]
            store.record([(("bench", f"{batch}"), Effect(counts=rows))], time.time())
            for c in rows:
                counts.add(c.function, c.minute, c.count)
            total += len(rows)
        elapsed = time.perf_counter() - started
        store.close()
    return {
        "benchmark": "counts into the history directly (1,000 per commit)",
        "value": round(total / elapsed),
        "unit": "counts/s",
        "target": "",
    }


async def _send(port: int, events: int, concurrency: int) -> float:
    now = time.time()
    start = time.strftime("%Y-%m-%dT%H:%M:00Z", time.gmtime(now))
    messages = [
        to_binary_event(
            CloudEvent(
                attributes={
                    "type": "dev.kdrl.invocations.v1",
                    "source": "/bench",
                    "id": f"e{i}",
                    "datacontenttype": "application/json",
                },
                data={"function": f"ns/f{i % 100}", "start": start, "seconds": 60, "count": 1},
            )
        )
        for i in range(events)
    ]
    queue: asyncio.Queue[Any] = asyncio.Queue()
    for message in messages:
        queue.put_nowait(message)

    async def sender(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            message = queue.get_nowait()
            async with session.post(
                f"http://127.0.0.1:{port}/events", data=message.body, headers=message.headers
            ) as response:
                assert response.status == 202, response.status

    started = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(sender(session) for _ in range(concurrency)))
    return time.perf_counter() - started


def http_ingest(events: int = 3000, concurrency: int = 16) -> dict[str, Any]:
    server, port, _ = extender_bench.serve_offline(
        EXAMPLES / "nodes.json", EXAMPLES / "pods.json", "--log-level", "WARNING"
    )
    try:
        elapsed = asyncio.run(_send(port, events, concurrency))
    finally:
        server.terminate()
        server.wait(timeout=10)
    return {
        "benchmark": f"events through the HTTP sink, durable ({concurrency} senders)",
        "value": round(events / elapsed),
        "unit": "events/s",
        "target": "",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [http_ingest(), direct_ingest(), memory(), *forecast_cycle()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        met = "" if "met" not in r else (": met" if r["met"] else ": MISSED")
        print(f"{r['benchmark']:<62} {r['value']:>10} {r['unit']:<9} {r['target']}{met}")
        if "models" in r:
            print(f"{'':<62} chosen models: {r['models']}")


if __name__ == "__main__":
    main()
