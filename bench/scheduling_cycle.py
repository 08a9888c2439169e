"""What one pod costs kube-scheduler in extender calls: its per-pod sequence, played in order.

For each pending pod, as kube-scheduler runs it with `nodeCacheCapable: true`: `filter` with
every node name (in a shuffled order: the scheduler walks nodes from a rotating start), then
`prioritize` with the names filter passed, then, where the configuration has a bind verb,
`bind` to the best-scored node. `kdrl serve` runs as a subprocess watching the repository's
fake API server (tests/fakekube.py: the real API's paths, status codes and watch stream; no
etcd behind it), so bind goes through the real `kubernetes` client and every bound pod comes
back through the pod watch, as on a cluster.

Arms, run one after the other in one invocation (each on a fresh fake cluster, the server
alone on the machine), in rounds so that drift hits every arm alike:
- `after, bind verb`: this tree, the extender binds (the configuration shipped before);
- `after, no bind verb`: this tree, kube-scheduler binds itself (shipped now; its own Binding
  write is Go and not measured here);
- with `--before REV`, `before, bind verb`: the server of git revision REV (a worktree), as
  shipped then.
Per verb: the time the scheduler waits (client side), and the server's own time from its
`Server-Timing` header (this tree only), split into decode (body read, JSON, checks), decide
(filter / policy), encode (the answer) or bind (the API call).

    python -m bench.scheduling_cycle                          # 500 nodes, 300 pods per arm
    python -m bench.scheduling_cycle --before 5a83121 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import random
import statistics
import subprocess
import tempfile
import threading
import urllib.parse
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any

from aiohttp import web

from bench import synthetic
from bench.extender import Connection, serve_online
from tests.fakekube import FakeKube

REPOSITORY = Path(__file__).resolve().parent.parent
WARM_UP = 20  # pods per arm before measuring


@contextmanager
def fake_api_server(
    nodes: list[dict[str, Any]], pods: list[dict[str, Any]]
) -> Iterator[tuple[FakeKube, str]]:
    """The fake API server on a loopback port, in a thread with its own event loop."""
    fake = FakeKube()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    address: dict[str, str] = {}

    async def start() -> web.AppRunner:
        for node in nodes:
            await fake.add("nodes", node)
        for pod in pods:
            await fake.add("pods", pod)
        runner = web.AppRunner(fake.app(), shutdown_timeout=0.1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        address["url"] = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return runner

    def run() -> None:
        asyncio.set_event_loop(loop)
        runner = loop.run_until_complete(start())
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(30)
    try:
        yield fake, address["url"]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def server_timing(head: dict[str, str]) -> dict[str, float]:
    """`Server-Timing: decode;dur=0.4, decide;dur=1.2` -> {"decode": 0.4, "decide": 1.2} (ms)."""
    phases = {}
    for part in head.get("server-timing", "").split(","):
        name, _, duration = part.strip().partition(";dur=")
        if name and duration:
            phases[name] = float(duration)
    return phases


def play(
    port: int, pods: list[dict[str, Any]], names: list[str], seed: int, *, bind: bool, api_url: str
) -> dict[str, Any]:
    """Each pod's call sequence; per verb the client-side milliseconds and the server's phases.
    Without the bind verb the pod is bound here, straight to the API server, as kube-scheduler
    does: not extender time, but its watch events reach the plugin as they would."""
    connection = Connection(port)
    api = urllib.parse.urlsplit(api_url)
    direct = http.client.HTTPConnection(api.hostname or "127.0.0.1", api.port, timeout=10)
    rng = random.Random(seed)
    waited: dict[str, list[float]] = defaultdict(list)
    phases: dict[tuple[str, str], list[float]] = defaultdict(list)
    per_pod: list[float] = []

    def call(verb: str, body: dict[str, Any]) -> tuple[Any, float]:
        request = Connection.request(verb, json.dumps(body).encode())
        started = perf_counter()
        status, head, answer = connection.exchange_with_headers(request)
        elapsed = (perf_counter() - started) * 1000
        if status != 200:
            raise RuntimeError(f"{verb} answered {status}: {answer[:200]!r}")
        waited[verb].append(elapsed)
        for phase, duration in server_timing(head).items():
            phases[(verb, phase)].append(duration)
        return json.loads(answer), elapsed

    for pod in pods:
        order = names[:]
        rng.shuffle(order)
        filtered, filter_ms = call("filter", {"Pod": pod, "Nodes": None, "NodeNames": order})
        passed = filtered["NodeNames"]
        priorities, prioritize_ms = call("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": passed})
        total = filter_ms + prioritize_ms
        best = max(priorities, key=lambda p: p["Score"])["Host"]
        meta = pod["metadata"]
        if bind:
            binding = {
                "PodName": meta["name"],
                "PodNamespace": meta["namespace"],
                "PodUID": meta["uid"],
                "Node": best,
            }
            answer, bind_ms = call("bind", binding)
            if answer.get("Error"):
                raise RuntimeError(f"bind failed: {answer['Error']}")
            total += bind_ms
        else:
            body = {
                "metadata": {"name": meta["name"], "uid": meta["uid"]},
                "target": {"kind": "Node", "name": best},
            }
            path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding"
            direct.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            response = direct.getresponse()
            response.read()
            if response.status != 201:
                raise RuntimeError(f"binding {meta['name']} answered {response.status}")
        per_pod.append(total)
    return {"waited": waited, "phases": phases, "per_pod": per_pod}


@dataclass(frozen=True)
class Arm:
    name: str
    bind: bool
    source: Path  # the tree whose `kdrl serve` runs


def run_arm(arm: Arm, n_nodes: int, n_pods: int, seed: int) -> dict[str, Any]:
    nodes, placed = synthetic.cluster(n_nodes, seed=n_nodes)
    pending = [synthetic.pending_pod(i, uid_prefix="cycle") for i in range(n_pods + WARM_UP)]
    with fake_api_server(nodes, placed + pending) as (_, url), tempfile.TemporaryDirectory() as tmp:
        server, port = serve_online(url, Path(tmp), source=arm.source)
        try:
            names = [n["metadata"]["name"] for n in nodes]
            play(port, pending[:WARM_UP], names, seed, bind=arm.bind, api_url=url)  # connection, caches
            return play(port, pending[WARM_UP:], names, seed, bind=arm.bind, api_url=url)
        finally:
            server.terminate()
            server.wait(timeout=10)


def run(n_nodes: int, n_pods: int, *, before: str | None = None, rounds: int = 1) -> list[dict[str, Any]]:
    with _worktree(before) as old:
        arms = [Arm("after, bind verb", True, REPOSITORY), Arm("after, no bind verb", False, REPOSITORY)]
        if old is not None:
            arms.insert(0, Arm(f"before ({before}), bind verb", True, old))
        measured: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for round_ in range(rounds):
            for arm in arms:
                measured[arm.name].append(run_arm(arm, n_nodes, n_pods, seed=round_))
    rows = []
    for arm in arms:
        merged = _merge(measured[arm.name])
        row: dict[str, Any] = {
            "arm": arm.name,
            "nodes": n_nodes,
            "pods": len(merged["per_pod"]),
            "per_pod_ms": _stats(merged["per_pod"]),
        }
        for verb in ("filter", "prioritize", "bind"):
            times = merged["waited"].get(verb)
            if times:
                phases = {
                    p: round(statistics.mean(v), 3) for (v_, p), v in merged["phases"].items() if v_ == verb
                }
                row[verb] = {"waited_ms": _stats(times), **phases}
        rows.append(row)
    return rows


def _merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"waited": defaultdict(list), "phases": defaultdict(list), "per_pod": []}
    for measured in runs:
        for key, values in measured["waited"].items():
            out["waited"][key] += values
        for key, values in measured["phases"].items():
            out["phases"][key] += values
        out["per_pod"] += measured["per_pod"]
    return out


@contextmanager
def _worktree(revision: str | None) -> Iterator[Path | None]:
    """A detached git worktree of `revision` (None: no worktree), removed afterwards."""
    if revision is None:
        yield None
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "before"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(path), revision], cwd=REPOSITORY, check=True
        )
        try:
            yield path
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(path)], cwd=REPOSITORY, check=False)


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "mean": round(statistics.mean(values), 3),
        "p50": round(ordered[len(ordered) // 2], 3),
        "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--pods", type=int, default=300, help="pods measured per arm and round")
    parser.add_argument("--before", help="also run the server of this git revision (e.g. a release tag)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds over the arms (drift hits each alike)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = run(args.nodes, args.pods, before=args.before, rounds=args.rounds)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{args.nodes} nodes; ms per call: waited (mean, p99); server phases (mean, Server-Timing)")
    header = ("arm", "verb", "mean", "p99", "decode", "decide", "encode", "bind")
    print(f"{header[0]:<30} {header[1]:<11}" + "".join(f"{h:>8}" for h in header[2:]))
    for row in rows:
        for verb in ("filter", "prioritize", "bind", "per pod"):
            cell = row.get(verb) if verb != "per pod" else {"waited_ms": row["per_pod_ms"]}
            if cell is None:
                continue
            numbers = [cell["waited_ms"]["mean"], cell["waited_ms"]["p99"]]
            numbers += [cell.get(p, float("nan")) for p in ("decode", "decide", "encode", "bind")]
            print(f"{row['arm']:<30} {verb:<11}" + "".join(f"{n:>8.2f}" for n in numbers))
    shipped, bound = rows[-1]["per_pod_ms"]["mean"], rows[-2]["per_pod_ms"]["mean"]
    print(f"no bind verb / bind verb, extender time per pod: {shipped / bound:.2f}")
    if args.before:
        print(f"now shipped / before, extender time per pod: {shipped / rows[0]['per_pod_ms']['mean']:.2f}")


if __name__ == "__main__":
    main()
