"""Events and extender calls at once: is either starved by the other?

    python -m bench.mixed_load                 # 500 nodes, tuned policy, 6 rounds of 3 s
    python -m bench.mixed_load --nodes 1000 --rounds 10 --json

One `kdrl serve` (offline, one port for both, as locally; the manifests give each its own
port, which shares the same event loop) on a synthetic cluster. Two clients, each in its own
process: the scheduler (one keep-alive connection, one prioritize call at a time, all node
names; bench.extender's client) and Eventing (16 concurrent senders of binary
`dev.kdrl.invocations.v1` events, each answered only after its commit). Each round measures,
in a random order, events alone, prioritize alone and both together; the ratios (together /
alone) are paired within a round and given as medians with a 95 % bootstrap interval, and so
is their sum over both clients: about 1 when the server's time is shared between them (neither
starved), far below 1 when one waits on the other.
On 2 cores the two clients take CPU the server would otherwise have: the "alone" rows have
one client fewer competing, which the ratios include.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from bench import extender, synthetic

SENDERS = 16


@dataclass(frozen=True)
class Round:
    events_per_s: float  # committed (202) events per second
    events_p99_ms: float
    prioritize_per_s: float
    prioritize_p99_ms: float


async def _flood(port: int, seconds: float, tag: str) -> tuple[int, list[float]]:
    start = time.strftime("%Y-%m-%dT%H:%M:00Z", time.gmtime())
    deadline = time.perf_counter() + seconds
    latencies: list[float] = []

    async def sender(session: aiohttp.ClientSession, who: int) -> None:
        i = 0
        while time.perf_counter() < deadline:
            message = synthetic.invocation(f"{tag}-{who}-{i}", f"ns/f{i % 100}", start, source="/bench/mixed")
            sent = time.perf_counter()
            url = f"http://127.0.0.1:{port}/events"
            async with session.post(url, data=message.body, headers=message.headers) as response:
                await response.read()
                if response.status == 202:
                    latencies.append(time.perf_counter() - sent)
            i += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(sender(session, who) for who in range(SENDERS)))
    return len(latencies), latencies


def _events_client(port: int, seconds: float, tag: str, out: Any) -> None:
    committed, latencies = asyncio.run(_flood(port, seconds, tag))
    out.put(("events", committed / seconds, float(np.percentile(latencies, 99)) if latencies else 0.0))


def _scheduler_client(port: int, seconds: float, payloads: list[bytes], out: Any) -> None:
    latencies = extender.measure(port, "prioritize", payloads, seconds)
    out.put(("prioritize", len(latencies) / seconds, float(np.percentile(latencies, 99))))


def one_round(
    port: int, payloads: list[bytes], seconds: float, which: str, tag: str
) -> dict[str, tuple[float, float]]:
    """`which`: events, prioritize or both; (per second, p99 s) for each client that ran."""
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    clients = []
    if which in ("events", "both"):
        clients.append(context.Process(target=_events_client, args=(port, seconds, tag, out)))
    if which in ("prioritize", "both"):
        clients.append(context.Process(target=_scheduler_client, args=(port, seconds, payloads, out)))
    for client in clients:
        client.start()
    results = [out.get(timeout=seconds + 60) for _ in clients]
    for client in clients:
        client.join()
    return {name: (rate, p99) for name, rate, p99 in results}


def _interval(ratios: list[float], rng: np.random.Generator) -> tuple[float, float, float]:
    medians = [float(np.median(rng.choice(ratios, len(ratios)))) for _ in range(2000)]
    low, high = np.percentile(medians, [2.5, 97.5])
    return float(np.median(ratios)), float(low), float(high)


def run(nodes: int, policy: str, rounds: int, seconds: float, seed: int = 0) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as folder:
        server, port = extender.start_server(Path(folder), nodes, policy)
        try:
            payloads = extender.bodies(nodes, 64, full_nodes=None)
            time.sleep(extender.SETTLE_S)  # the first forecast cycle (numba) must not land in a round
            one_round(port, payloads, 1.0, "both", "warm-up")
            alone: dict[str, list[tuple[float, float]]] = {"events": [], "prioritize": []}
            together: dict[str, list[tuple[float, float]]] = {"events": [], "prioritize": []}
            for r in range(rounds):
                for which in rng.permutation(["events", "prioritize", "both"]):
                    measured = one_round(port, payloads, seconds, str(which), f"r{r}-{which}")
                    for name, value in measured.items():
                        (together if which == "both" else alone)[name].append(value)
        finally:
            server.terminate()
            server.wait(timeout=30)
    table: dict[str, Any] = {"nodes": nodes, "policy": policy, "rounds": rounds, "seconds": seconds}
    # Each client's share of what it gets alone, summed: ~1 when the server's time is shared
    # between them (neither starved), far below 1 when one waits on the other for nothing.
    shares = [
        sum(together[name][r][0] / alone[name][r][0] for name in ("events", "prioritize"))
        for r in range(rounds)
    ]
    table["shares_summed"] = [round(v, 3) for v in _interval(shares, rng)]
    for name in ("events", "prioritize"):
        rate_alone = [rate for rate, _ in alone[name]]
        rate_together = [rate for rate, _ in together[name]]
        table[name] = {
            "per_s_alone": round(float(np.median(rate_alone))),
            "per_s_together": round(float(np.median(rate_together))),
            "rate_ratio": [
                round(v, 3) for v in _interval([t / a for t, a in zip(rate_together, rate_alone)], rng)
            ],
            "p99_ms_alone": round(float(np.median([p for _, p in alone[name]])) * 1000, 2),
            "p99_ms_together": round(float(np.median([p for _, p in together[name]])) * 1000, 2),
        }
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--policy", default="tuned")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    table = run(args.nodes, args.policy, args.rounds, args.seconds)
    if args.json:
        print(json.dumps(table, indent=2))
        return
    print(f"{table['nodes']} nodes, policy {table['policy']}, {table['rounds']} rounds of {args.seconds:g} s")
    print(
        f"{'client':<11} {'alone /s':>9} {'together /s':>12} {'together/alone (95% CI)':>26} "
        f"{'p99 ms alone':>13} {'p99 ms together':>16}"
    )
    for name in ("events", "prioritize"):
        row = table[name]
        ratio, low, high = row["rate_ratio"]
        interval = f"{ratio:.3f} [{low:.3f}, {high:.3f}]"
        print(
            f"{name:<11} {row['per_s_alone']:>9} {row['per_s_together']:>12} {interval:>26} "
            f"{row['p99_ms_alone']:>13} {row['p99_ms_together']:>16}"
        )
    total, low, high = table["shares_summed"]
    print(
        f"together/alone, both clients summed: {total:.3f} [{low:.3f}, {high:.3f}] (1: shared, none starved)"
    )


if __name__ == "__main__":
    main()
