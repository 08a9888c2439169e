"""Forecaster speed and memory: ingest, one forecast cycle for 10,000 functions, history size.

    python -m bench.forecaster            # the table
    python -m bench.forecaster --json
    python -m bench.forecaster --functions 10000,100000 --engine local,ray:1,ray:2   # scaling
    python -m bench.forecaster --statsforecast-ray   # statsforecast's own Ray path, for comparison
    python -m bench.forecaster --functions 10000,20000 --flood 100000 --rss --sigterm

- ingest through the HTTP sink: `kdrl serve` offline in a subprocess, 16 concurrent senders
  posting binary `dev.kdrl.invocations.v1` events, each acknowledged only after its commit;
- ingest into the history directly: counts per second through `MinuteCounts` and one
  `HistoryStore` transaction per 1,000;
- a forecast cycle for 10,000 functions, 30-minute horizon, after a warm-up (targets: <= 10 s),
  and the hourly model choice (backtest) that precedes it;
- memory of two days of minute history for 10,000 functions (target: <= 100 MB).
Histories are the shared Azure rows (first 12 hours, repeated to 10,000 functions) when the
trace is beside the repository, else seeded synthetic ones.

`--rss`: the whole service's memory instead, what the StatefulSet's request and limit are set
from. Per size, a real `kdrl serve` (offline, default settings, so `KDRL_MAX_FUNCTIONS` applies)
starts on a history database of that many functions' last 12 hours (what a forecast fit reads);
`--flood N` adds N names of one invocation each, the newest, as a flood of made-up names would.
The table gives the functions it holds, its startup time (the history read back) and resident
memory then, its first forecast cycle's time (model choice and forecast), and after that cycle
its peak (VmHWM) and current (VmRSS) resident memory.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import signal
import subprocess
import tempfile
import time
import tracemalloc
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from bench import extender as extender_bench
from bench import synthetic
from bench.simulator import SHARED_TRACE
from forecaster.forecasting import Engine, Forecaster, LocalEngine
from forecaster.history import MINUTES_KEPT, Count, Effect, HistoryStore, MinuteCounts
from plugin.cluster import ClusterCache
from plugin.functions import FunctionCatalog, Objects
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


def forecast_cycle(
    engines: Sequence[str] = ("local",), sizes: Sequence[int] = (FUNCTIONS,)
) -> list[dict[str, Any]]:
    """Model choice and a forecast cycle for each size on each engine, the same history for
    all engines of a size. `ray`: a local Ray of this machine's cores, `ray:N` of N workers (its
    overhead, honestly: on one machine the local engine has the same cores without the
    transfers). Local rows also give the time per shard (`CHUNK_FUNCTIONS` functions on one
    core), what a cluster's cycle divides by its workers; `driver MiB` is this process's peak
    resident memory after the size's rows (sizes ascending, so a larger one's peak is its own)."""
    rows = []
    for functions in sorted(sizes):
        counts = _counts(functions)
        for name in engines:
            rows += _cycle(Forecaster(counts, engine=_engine(name)), name)
    return rows


class TimedEngine(LocalEngine):
    """The local engine, timing each shard."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def map(self, work: Callable[[Any], Any], tasks: Iterable[Any]) -> Iterator[Any]:
        for task in tasks:
            started = time.perf_counter()
            result = work(task)
            self.seconds.append(time.perf_counter() - started)
            yield result


def _cycle(forecaster: Forecaster, name: str) -> list[dict[str, Any]]:
    functions = len(forecaster.counts)
    forecaster.forecast(END, horizon=30)  # warm-up: numba compiles here (in every worker), not in the cycle
    shards = forecaster.engine.seconds if isinstance(forecaster.engine, TimedEngine) else []
    shards.clear()
    started = time.perf_counter()
    forecaster.choose(END, horizon=30)
    chosen, backtests = time.perf_counter(), len(shards)
    forecasts = forecaster.forecast(END, horizon=30)
    done = time.perf_counter()
    models: dict[str, int] = {}
    for f in forecasts.values():
        models[f.model] = models.get(f.model, 0) + 1
    peak = _peak_rss_mib()
    per_shard = {
        "model choice": shards[:backtests],
        "forecast cycle": shards[backtests:],
    }
    return [
        {
            "benchmark": f"model choice (backtest), {functions:,} functions, {name}",
            "value": round(chosen - started, 2),
            "unit": "s",
            "target": "hourly, in the background",
            **_shard_stats(per_shard["model choice"]),
            "driver_mib": peak,
        },
        {
            "benchmark": f"forecast cycle, {functions:,} functions, 30 min, {name}",
            "value": round(done - chosen, 2),
            "unit": "s",
            "target": "<= 10 s at 10,000; <= 60 s at 100,000 (cluster)",
            "met": done - chosen <= (10 if functions <= FUNCTIONS else 60),
            **_shard_stats(per_shard["forecast cycle"]),
            "models": models,
            "driver_mib": peak,
        },
    ]


def _shard_stats(seconds: list[float]) -> dict[str, Any]:
    if not seconds:
        return {}
    return {
        "shards": len(seconds),
        "shard_mean_s": round(float(np.mean(seconds)), 3),
        "shard_max_s": round(max(seconds), 3),
    }


def _peak_rss_mib() -> int:
    """This process's peak resident memory so far (VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) // 1024
    return 0


def statsforecast_ray(functions: int = FUNCTIONS, workers: int = 2) -> list[dict[str, Any]]:
    """statsforecast's own distributed path (a Ray Dataset through fugue) against our Ray tasks,
    for the part of a forecast cycle statsforecast does: each chosen model's forecasts for the
    functions that chose it (idle times and calibration left out, in its favour). Needs
    `fugue[ray]`, which the project does not install (this comparison is why)."""
    try:
        import fugue_ray  # type: ignore[import-untyped,import-not-found,unused-ignore]  # noqa: F401
        import ray
    except ImportError as error:
        print(f"skipped: statsforecast's Ray path needs fugue[ray] ({error}); pip install 'fugue[ray]'")
        return []
    from forecaster.forecasting import _engine as statsforecast
    from forecaster.forecasting import _frame

    counts = _counts(functions)
    forecaster = Forecaster(counts)
    choice = forecaster.choose(END, horizon=30)
    histories = forecaster.histories(END)
    by_model: dict[str, list[str]] = {}
    for kind, members in forecaster.classes(END, histories).items():
        for function in members:
            for name in dict.fromkeys(choice.models(function, kind)):
                by_model.setdefault(name, []).append(function)
    frames = {
        name: _frame(members, histories, END, forecaster.training_minutes)
        for name, members in by_model.items()
    }
    rows = []
    started = time.perf_counter()
    for name, frame in frames.items():
        statsforecast([name]).forecast(df=frame, h=30)
    rows.append(("statsforecast, in process", time.perf_counter() - started))
    ray.shutdown()
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    started = time.perf_counter()
    for name, frame in frames.items():
        statsforecast([name]).forecast(df=ray.data.from_pandas(frame), h=30).to_pandas()
    rows.append((f"statsforecast's Ray path (fugue), {workers} workers", time.perf_counter() - started))
    ray.shutdown()
    return [
        {
            "benchmark": f"{label}: {len(histories):,} functions' model forecasts, {len(frames)} models",
            "value": round(seconds, 2),
            "unit": "s",
            "target": "",
        }
        for label, seconds in rows
    ]


def _counts(functions: int) -> MinuteCounts:
    """`functions` functions' last 12 hours (those with a call in them)."""
    counts = MinuteCounts()
    data = histories(functions, 720)
    minutes = np.arange(END - 720, END, dtype=np.int64)
    for i, row in enumerate(data):
        busy = np.flatnonzero(row)
        counts.load(f"ns/f{i:06d}", minutes[busy], row[busy].astype(np.int64))
    return counts


def _engine(name: str) -> Engine:
    """`local`, or `ray` (a local Ray of this machine's cores), or `ray:N` (of N workers)."""
    if name == "local":
        return TimedEngine()
    import ray

    from plugin.ray_engine import RayEngine

    workers = int(name.partition(":")[2] or 0) or None
    ray.shutdown()  # each Ray row starts its own, of its own size
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    return RayEngine(str(ray.get_runtime_context().gcs_address))


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
    messages = [synthetic.invocation(f"e{i}", f"ns/f{i % 100}", start) for i in range(events)]
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


def _history_database(path: Path, functions: int, flood: int, now_minute: int) -> None:
    store = HistoryStore(path)
    data = histories(functions, 720)
    first = now_minute - 720
    for start in range(0, functions, 500):
        rows = [
            Count(f"ns/f{i:06d}", first + int(m), int(data[i, m]))
            for i in range(start, min(start + 500, functions))
            for m in np.flatnonzero(data[i])
        ]
        store.record([(None, Effect(counts=rows))], time.time())
    names = [Count(f"flood/f{i:06d}", now_minute, 1) for i in range(flood)]
    store.record([(None, Effect(counts=names))], time.time())
    store.close()


def _metric(port: int, name: str) -> float:
    """The sum of a metric's series on `/metrics`."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        lines = response.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith((name + " ", name + "{")))


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _serve_on(history: Path) -> tuple[subprocess.Popen[bytes], int]:
    """`kdrl serve` offline on the history database `history`, once ready (it reads it back)."""
    server, port, _ = extender_bench.serve_offline(
        EXAMPLES / "nodes.json",
        EXAMPLES / "pods.json",
        "--log-level",
        "WARNING",
        "--history-path",
        str(history),
        ready_within_s=600,
    )
    return server, port


def service_memory(functions: int, flood: int = 0) -> dict[str, Any]:
    """A real `kdrl serve` on a history of `functions` (+ `flood`): memory after its first cycle."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "h.db"
        _history_database(path, functions, flood, int(time.time() // 60))
        started = time.perf_counter()
        server, port = _serve_on(path)
        try:
            loaded = time.perf_counter() - started
            ready = _status_kib(server.pid, "VmRSS")
            while _metric(port, "kdrl_forecast_cycle_duration_seconds_count") < 1:
                if server.poll() is not None:
                    raise RuntimeError("kdrl serve exited during its first forecast cycle")
                time.sleep(1)
            cycle = _metric(port, "kdrl_forecast_cycle_duration_seconds_sum")
            held = _metric(port, "kdrl_history_functions")
            peak, current = _status_kib(server.pid, "VmHWM"), _status_kib(server.pid, "VmRSS")
        finally:
            server.terminate()
            server.wait(timeout=60)
    label = f"{functions:,}" + (f" + {flood:,} flood names" if flood else "")
    return {
        "benchmark": f"kdrl serve, history of {label}",
        "functions held": int(held),
        "startup s": round(loaded, 1),
        "ready MiB": round(ready / 1024),
        "first cycle s": round(cycle, 1),
        "peak MiB": round(peak / 1024),
        "after MiB": round(current / 1024),
    }


def shutdown_time(functions: int, into_cycle_s: float = 10.0) -> dict[str, Any]:
    """SIGTERM to a real `kdrl serve` `into_cycle_s` after it became ready (its first forecast
    cycle, minutes long at the cap, is running): seconds until the process has exited."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "h.db"
        _history_database(path, functions, 0, int(time.time() // 60))
        server, port = _serve_on(path)
        time.sleep(into_cycle_s)
        cycles = _metric(port, "kdrl_forecast_cycle_duration_seconds_count")
        signalled = time.perf_counter()
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=300)
        finally:
            server.kill()
        return {
            "benchmark": f"kdrl serve, {functions:,} functions, SIGTERM {into_cycle_s:g} s into a cycle",
            "cycles done": int(cycles),
            "exit s": round(time.perf_counter() - signalled, 1),
            "exit code": code,
        }


def catalog_memory(services: int = 20_000, nodes: int = 5_000) -> list[dict[str, Any]]:
    """Memory the rest of the service holds at the cap (tracemalloc): `services` Knative
    Services as the catalog keeps them against as listed (with kubectl's last-applied copy and
    managedFields), and the cluster cache of a synthetic cluster of `nodes` nodes."""
    template = {
        "metadata": {"annotations": {"kdrl.dev/priority": "high"}},
        "spec": {
            "containers": [
                {
                    "image": "registry.example.com/shop/hello@sha256:" + "a" * 64,
                    "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}},
                }
            ]
        },
    }
    service: dict[str, Any] = {
        "apiVersion": "serving.knative.dev/v1",
        "kind": "Service",
        "metadata": {"name": "hello", "namespace": "shop", "uid": "u", "resourceVersion": "1"},
        "spec": {"template": template},
        "status": {"traffic": [{"revisionName": "hello-00002", "percent": 100}]},
    }
    service["metadata"] |= {
        "annotations": {"kubectl.kubernetes.io/last-applied-configuration": json.dumps(service)},
        "managedFields": [
            {
                "manager": "kubectl",
                "operation": "Update",
                "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:template": {"f:spec": {"f:containers": {}}}}},
            }
        ]
        * 3,
    }
    text, rows = json.dumps(service), []
    for label, store in (("as the catalog keeps them", FunctionCatalog().services), ("as listed", Objects())):
        gc.collect()
        tracemalloc.start()
        listed = [json.loads(text) for _ in range(services)]
        for i, item in enumerate(listed):
            item["metadata"]["name"] = f"s{i}"
        store.replace(listed)
        del listed
        gc.collect()
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        rows.append({"benchmark": f"{services:,} Knative Services {label}", "MiB": round(held / 2**20)})
    node_objects, pod_objects = synthetic.cluster(nodes, seed=nodes)
    tracemalloc.start()
    ClusterCache.from_objects(node_objects, pod_objects)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    rows.append(
        {
            "benchmark": f"cluster cache, {nodes:,} nodes and {len(pod_objects):,} pods",
            "MiB": round(peak / 2**20),
        }
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--statsforecast-ray", action="store_true", help="statsforecast's own Ray path against ours"
    )
    parser.add_argument("--rss", action="store_true", help="the service's memory per history size")
    parser.add_argument("--catalog", action="store_true", help="the Services' and the cluster cache's memory")
    parser.add_argument(
        "--engine", default="local", help="forecast engines to time, comma-separated: local, ray"
    )
    parser.add_argument(
        "--functions", default=str(FUNCTIONS), help="history sizes, comma-separated (the cycle table, --rss)"
    )
    parser.add_argument(
        "--sigterm", action="store_true", help="time a SIGTERM mid-cycle at the largest --functions size"
    )
    parser.add_argument(
        "--flood", type=int, default=0, help="with --rss: one more run, the largest size + N names"
    )
    args = parser.parse_args()
    if args.catalog:
        for row in catalog_memory():
            print(f"{row['benchmark']:<62} {row['MiB']:>6} MiB")
        return
    if args.rss or args.sigterm:
        sizes = [int(n) for n in args.functions.split(",")]
        table = [service_memory(n) for n in sizes] if args.rss else []
        if args.rss and args.flood:
            table.append(service_memory(max(sizes), args.flood))
        shutdown = [shutdown_time(max(sizes))] if args.sigterm else []
        if args.json:
            print(json.dumps(table + shutdown, indent=2))
            return
        for rows in (table, shutdown):
            if rows:
                print(" | ".join(rows[0]))
                for r in rows:
                    print(" | ".join(str(v) for v in r.values()))
        return
    engines, sizes = args.engine.split(","), [int(n) for n in args.functions.split(",")]
    if args.statsforecast_ray:
        for r in statsforecast_ray(min(sizes)):
            print(f"{r['benchmark']:<90} {r['value']:>8} {r['unit']}")
        return
    if engines != ["local"] or sizes != [FUNCTIONS]:  # the scaling table alone
        scaling = forecast_cycle(engines, sizes)
        if args.json:
            print(json.dumps(scaling, indent=2))
            return
        print("| benchmark | s | shards | s per shard (mean / max) | driver peak MiB |")
        print("| --- | ---: | ---: | --- | ---: |")
        for r in scaling:
            shard = f"{r['shard_mean_s']} / {r['shard_max_s']}" if "shards" in r else ""
            print(
                f"| {r['benchmark']} | {r['value']} | {r.get('shards', '')} | {shard} | {r['driver_mib']} |"
            )
        return
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
