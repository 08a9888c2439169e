"""Extender throughput and latency over real HTTP on loopback, with the client in another process.

Starts `kdrl serve` offline (a subprocess) on a synthetic cluster of N nodes, then this
process plays kube-scheduler: one keep-alive connection, one call at a time (the scheduling
cycle is sequential), distinct pending pods, all N node names in a shuffled order
(`nodeCacheCapable: true`; the worst case, as the scheduler may send fewer). Prints p50/p99
latency and calls per second.

    python -m bench.extender                 # the table
    python -m bench.extender --json          # the same as JSON
    python -m bench.extender --nodes 500 --verb prioritize --seconds 5
    python -m bench.extender --metrics-cost  # metrics on against off, paired, one table
    python -m bench.extender --decisions-cost  # decision recording on against off (prioritize + bind)
    python -m bench.extender --policy-cost onnx  # the learned policy against tuned, paired (prioritize)

Targets on a 2-core machine: >= 1,000 prioritize calls/s at 500 nodes, p99 <= 5 ms at
1,000 nodes, p99 <= 20 ms at 5,000 nodes.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench import synthetic

NODE_COUNTS = (100, 500, 1000, 5000)
VERBS = ("prioritize", "filter")
TARGETS = {  # (verb, nodes) -> (metric, bound, "min"|"max")
    ("prioritize", 500): ("calls_per_s", 1000.0, "min"),
    ("prioritize", 1000): ("p99_ms", 5.0, "max"),
    ("prioritize", 5000): ("p99_ms", 20.0, "max"),
}


@dataclass(frozen=True)
class Row:
    verb: str
    nodes: int
    mode: str
    calls: int
    p50_ms: float
    p99_ms: float
    calls_per_s: float
    target: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_offline(
    nodes: Path,
    pods: Path,
    *extra: str,
    env: dict[str, str] | None = None,
    capture_logs: bool = False,
    ready_within_s: float = 60.0,
) -> tuple[subprocess.Popen[bytes], int, dict[str, object]]:
    """`kdrl serve` offline in a subprocess on a free port; returns once `/readyz` says ready.

    With `capture_logs`, its stderr is a pipe the caller must drain (`communicate`)."""
    return _serve(
        ["--nodes", str(nodes), "--pods", str(pods), *extra],
        env=env,
        capture_logs=capture_logs,
        ready_within_s=ready_within_s,
    )


def serve_online(
    api_url: str, directory: Path, *, source: Path | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """`kdrl serve` watching the API server at `api_url`; returns once its cache has synced.
    `source`: the tree to run it from (another checkout of the repository; default this one)."""
    history = str(directory / "history.db")
    env = {"PYTHONPATH": str(source)} if source is not None else None
    server, port, _ = _serve(
        ["--kube-api-url", api_url, "--log-level", "WARNING", "--history-path", history], env=env, cwd=source
    )
    return server, port


def _serve(
    extra: list[str],
    *,
    env: dict[str, str] | None = None,
    capture_logs: bool = False,
    cwd: Path | None = None,
    ready_within_s: float = 60.0,
) -> tuple[subprocess.Popen[bytes], int, dict[str, object]]:
    port = free_port()
    command = [sys.executable, "-m", "plugin", "serve", "--host", "127.0.0.1", "--port", str(port), *extra]
    # /readyz lives on the admin port where one is given (one port per audience), else on --port
    ready_port = int(extra[extra.index("--admin-port") + 1]) if "--admin-port" in extra else port
    if "--history-path" not in extra:  # keep the server's database out of the working tree
        command += ["--history-path", str(Path(tempfile.mkdtemp()) / "history.db")]
    stderr = subprocess.PIPE if capture_logs else None
    server = subprocess.Popen(command, env={**os.environ, **(env or {})}, stderr=stderr, cwd=cwd)
    deadline = time.monotonic() + ready_within_s
    while time.monotonic() < deadline and server.poll() is None:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", ready_port, timeout=1)
            connection.request("GET", "/readyz")
            response = connection.getresponse()
            if response.status == 200:
                return server, port, json.loads(response.read())
        except OSError:
            pass
        time.sleep(0.05)
    server.kill()
    raise RuntimeError("kdrl serve did not become ready")


def start_server(
    directory: Path, n_nodes: int, policy: str = "kube-default", *, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    nodes, pods = synthetic.cluster(n_nodes, seed=n_nodes)
    (directory / "nodes.json").write_text(json.dumps(synthetic.as_list("Node", nodes)))
    (directory / "pods.json").write_text(json.dumps(synthetic.as_list("Pod", pods)))
    server, port, _ = serve_offline(
        directory / "nodes.json",
        directory / "pods.json",
        "--log-level",
        "WARNING",
        "--policy",
        policy,
        env=env,
    )
    return server, port


def bodies(n_nodes: int, count: int, *, full_nodes: list[dict[str, object]] | None) -> list[bytes]:
    """Distinct pending pods, each with the node list in its own order (kube-scheduler walks
    nodes zone by zone from a rotating start, so its order never matches ours)."""
    rng = random.Random(n_nodes)
    out = []
    for i in range(count):
        names = [f"node-{j:05d}" for j in range(n_nodes)]
        rng.shuffle(names)
        pod = synthetic.pending_pod(i, uid_prefix="bench")
        args = (
            {"Pod": pod, "Nodes": None, "NodeNames": names}
            if full_nodes is None
            else {"Pod": pod, "Nodes": {"metadata": {}, "items": full_nodes}, "NodeNames": None}
        )
        out.append(json.dumps(args).encode())
    return out


class Connection:
    """A lean HTTP/1.1 keep-alive client (prebuilt requests, Content-Length bodies), so the
    client's own overhead stays small next to the server's, as with Go's net/http."""

    def __init__(self, port: int) -> None:
        self._socket = socket.create_connection(("127.0.0.1", port), timeout=10)
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = b""

    @staticmethod
    def request(verb: str, body: bytes) -> bytes:
        head = (
            f"POST /scheduler/{verb} HTTP/1.1\r\nHost: kdrl\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        return head.encode() + body

    def exchange(self, request: bytes) -> tuple[int, bytes]:
        status, _, body = self.exchange_with_headers(request)
        return status, body

    def exchange_with_headers(self, request: bytes) -> tuple[int, dict[str, str], bytes]:
        """Status, headers (lower-cased names) and body of one request's answer."""
        self._socket.sendall(request)
        while b"\r\n\r\n" not in self._buffer:
            self._buffer += self._receive()
        head, _, rest = self._buffer.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers["content-length"])
        while len(rest) < length:
            rest += self._receive()
        self._buffer = rest[length:]
        return status, headers, rest[:length]

    def _receive(self) -> bytes:
        chunk = self._socket.recv(1 << 20)
        if not chunk:
            raise ConnectionError("server closed the connection")
        return chunk


def measure(port: int, verb: str, payloads: list[bytes], seconds: float) -> list[float]:
    """Latencies of `verb` calls for `seconds`; `placement`: a prioritize, then the bind of the
    pod to the node it ranked first, timed together."""
    connection = Connection(port)
    requests = [Connection.request(verb.replace("placement", "prioritize"), body) for body in payloads]
    binds = [_binding(body) for body in payloads] if verb == "placement" else []
    for request in requests[:20]:  # warm-up: connection, caches, allocator
        connection.exchange(request)
    latencies = []
    end = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < end:
        start = time.perf_counter()
        status, answer = connection.exchange(requests[i % len(requests)])
        if binds and status == 200:
            best = max(json.loads(answer), key=lambda entry: entry["Score"])["Host"]
            body = json.dumps({**binds[i % len(binds)], "Node": best}).encode()
            status, answer = connection.exchange(Connection.request("bind", body))
            status = 500 if json.loads(answer).get("Error") else status
        latencies.append(time.perf_counter() - start)
        if status != 200:
            raise RuntimeError(f"{verb} answered {status}: {answer[:200]!r}")
        i += 1
    return latencies


def _binding(prioritize_body: bytes) -> dict[str, str]:
    meta = json.loads(prioritize_body)["Pod"]["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"]}


def judge(verb: str, n_nodes: int, row: dict[str, float]) -> str:
    target = TARGETS.get((verb, n_nodes))
    if target is None:
        return ""
    metric, bound, kind = target
    ok = row[metric] >= bound if kind == "min" else row[metric] <= bound
    sign = ">=" if kind == "min" else "<="
    return f"{metric} {sign} {bound:g}: {'met' if ok else 'MISSED'}"


def run(
    node_counts: tuple[int, ...],
    verbs: tuple[str, ...],
    seconds: float,
    full_nodes: bool,
    policy: str = "kube-default",
) -> list[Row]:
    rows = []
    for n_nodes in node_counts:
        with tempfile.TemporaryDirectory() as tmp:
            server, port = start_server(Path(tmp), n_nodes, policy)
            try:
                objects = json.loads((Path(tmp) / "nodes.json").read_text())["items"] if full_nodes else None
                payloads = bodies(n_nodes, 64, full_nodes=objects)
                for verb in verbs:
                    latencies = np.array(measure(port, verb, payloads, seconds)) * 1000
                    stats = {
                        "p50_ms": float(np.percentile(latencies, 50)),
                        "p99_ms": float(np.percentile(latencies, 99)),
                        "calls_per_s": float(len(latencies) / (latencies.sum() / 1000)),
                    }
                    rows.append(
                        Row(
                            verb=verb,
                            nodes=n_nodes,
                            mode="Nodes" if full_nodes else "NodeNames",
                            calls=len(latencies),
                            target=judge(verb, n_nodes, stats) if not full_nodes else "",
                            **{k: round(v, 3) for k, v in stats.items()},
                        )
                    )
            finally:
                server.terminate()
                server.wait(timeout=10)
    return rows


SETTLE_S = 15.0


@dataclass(frozen=True)
class SettingCost:
    setting: str  # the KDRL_ boolean turned on and off
    verb: str
    nodes: int
    rounds: int
    p50_on_ms: float
    p50_off_ms: float
    ratio: float  # mean latency, setting on / off: the median over paired rounds
    ratio_low: float  # a 95 % bootstrap interval of that median
    ratio_high: float
    verdict: str


COSTS = {"metrics": "KDRL_METRICS", "decisions": "KDRL_DECISIONS_RECORD"}


def setting_cost(
    setting: str,
    node_counts: tuple[int, ...],
    verbs: tuple[str, ...],
    seconds: float,
    rounds: int,
    seed: int = 0,
) -> list[SettingCost]:
    """The extender with a boolean setting on (`metrics`: KDRL_METRICS, `decisions`:
    KDRL_DECISIONS_RECORD) against off, paired (`paired_cost`). The `placement` verb is a
    prioritize and the bind that follows it (what recording a decision rides on)."""
    variable = COSTS[setting]
    on, off = ("kube-default", {variable: "true"}), ("kube-default", {variable: "false"})
    return paired_cost(variable, on, off, 1.05, node_counts, verbs, seconds, rounds, seed)


def policy_cost(
    policy: str, node_counts: tuple[int, ...], verbs: tuple[str, ...], seconds: float, rounds: int
) -> list[SettingCost]:
    """`policy` against `tuned` (the default), paired: the learned policy may cost at most 20 %
    of tuned's calls per second (a mean latency ratio up to 1 / 0.8)."""
    label = f"policy {policy} / tuned"
    return paired_cost(label, (policy, {}), ("tuned", {}), 1 / 0.8, node_counts, verbs, seconds, rounds)


Variant = tuple[str, dict[str, str]]  # the server's policy and environment


def paired_cost(
    label: str,
    on: Variant,
    off: Variant,
    limit: float,
    node_counts: tuple[int, ...],
    verbs: tuple[str, ...],
    seconds: float,
    rounds: int,
    seed: int = 0,
) -> list[SettingCost]:
    """Two servers side by side, measured in alternating short rounds (on, off, off, on, ...), so
    machine noise hits both alike; the ratio is of each round pair's mean latency, its median
    over the rounds with a bootstrap interval, judged against `limit`."""
    rng = np.random.default_rng(seed)
    out = []
    for n_nodes in node_counts:
        with tempfile.TemporaryDirectory() as tmp:
            on_dir, off_dir = Path(tmp) / "on", Path(tmp) / "off"
            on_dir.mkdir()
            off_dir.mkdir()
            servers = {
                "on": start_server(on_dir, n_nodes, on[0], env=on[1]),
                "off": start_server(off_dir, n_nodes, off[0], env=off[1]),
            }
            try:
                payloads = bodies(n_nodes, 64, full_nodes=None)
                time.sleep(SETTLE_S)  # each server's first forecast cycle (numba) must not land in a round
                for verb in verbs:
                    for _, port in servers.values():
                        measure(port, verb, payloads, 1.0)  # warm both alike
                    ratios: list[float] = []
                    latencies: dict[str, list[float]] = {"on": [], "off": []}
                    for i in range(rounds):
                        means = {}
                        for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
                            measured = measure(servers[mode][1], verb, payloads, seconds / rounds)
                            latencies[mode].extend(measured)
                            means[mode] = float(np.mean(measured))
                        ratios.append(means["on"] / means["off"])
                    medians = [float(np.median(rng.choice(ratios, len(ratios)))) for _ in range(2000)]
                    low, high = np.percentile(medians, [2.5, 97.5])
                    ratio = float(np.median(ratios))
                    out.append(
                        SettingCost(
                            setting=label,
                            verb=verb,
                            nodes=n_nodes,
                            rounds=rounds,
                            p50_on_ms=round(float(np.percentile(latencies["on"], 50)) * 1000, 3),
                            p50_off_ms=round(float(np.percentile(latencies["off"], 50)) * 1000, 3),
                            ratio=round(ratio, 4),
                            ratio_low=round(float(low), 4),
                            ratio_high=round(float(high), 4),
                            verdict=f"at most x{limit:.2f}: " + ("met" if ratio <= limit else "MISSED"),
                        )
                    )
            finally:
                for server, _ in servers.values():
                    server.terminate()
                    server.wait(timeout=10)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, action="append", help="node counts (default: 100 500 1000 5000)")
    parser.add_argument("--verb", choices=(*VERBS, "placement"), action="append")
    parser.add_argument("--seconds", type=float, default=3.0, help="measuring time per verb and size")
    parser.add_argument(
        "--full-nodes", action="store_true", help="send full Node objects (nodeCacheCapable: false)"
    )
    parser.add_argument("--policy", default="kube-default", help="placement policy the server runs")
    parser.add_argument(
        "--metrics-cost",
        action="store_true",
        help="compare metrics on and off, paired (default sizes 500 and 1000 nodes, 24 rounds)",
    )
    parser.add_argument(
        "--decisions-cost",
        action="store_true",
        help="compare decision recording on and off, paired, on prioritize + bind (the placement verb)",
    )
    parser.add_argument(
        "--policy-cost",
        metavar="POLICY",
        help="compare POLICY (e.g. onnx) against tuned, paired, on prioritize (at most 20 %% fewer calls/s)",
    )
    parser.add_argument("--rounds", type=int, default=24, help="paired rounds for a cost comparison")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.metrics_cost or args.decisions_cost or args.policy_cost:
        sizes = tuple(args.nodes or (500, 1000))
        if args.policy_cost:
            verbs = tuple(args.verb or ("prioritize",))
            costs = policy_cost(args.policy_cost, sizes, verbs, args.seconds * 4, args.rounds)
        else:
            setting, default = ("metrics", VERBS) if args.metrics_cost else ("decisions", ("placement",))
            costs = setting_cost(setting, sizes, tuple(args.verb or default), args.seconds * 4, args.rounds)
        header = (
            f"{'setting':<22} {'verb':<11} {'nodes':>6} {'rounds':>6} {'p50 on':>8} {'p50 off':>8} "
            f"{'on/off (95% CI)':>22}"
        )
        show(costs, args.json, header, _cost_line)
        return
    rows = run(
        tuple(args.nodes or NODE_COUNTS),
        tuple(args.verb or VERBS),
        args.seconds,
        args.full_nodes,
        args.policy,
    )
    header = f"{'verb':<11} {'nodes':>6} {'mode':<9} {'calls':>6} {'p50 ms':>8} {'p99 ms':>8} {'calls/s':>9}"
    show(rows, args.json, header, _row_line)


def show(items: Sequence[Any], as_json: bool, header: str, line: Callable[[Any], str]) -> None:
    """Dataclass rows as JSON, or as a table: `header` and one `line` each, then the target."""
    if as_json:
        print(json.dumps([asdict(item) for item in items], indent=2))
        return
    print(f"{header}  target")
    for item in items:
        print(line(item))


def _row_line(r: Row) -> str:
    return (
        f"{r.verb:<11} {r.nodes:>6} {r.mode:<9} {r.calls:>6} {r.p50_ms:>8.2f} {r.p99_ms:>8.2f} "
        f"{r.calls_per_s:>9.0f}  {r.target}"
    )


def _cost_line(c: SettingCost) -> str:
    interval = f"{c.ratio:.3f} [{c.ratio_low:.3f}, {c.ratio_high:.3f}]"
    return (
        f"{c.setting:<22} {c.verb:<11} {c.nodes:>6} {c.rounds:>6} {c.p50_on_ms:>8.2f} {c.p50_off_ms:>8.2f} "
        f"{interval:>22}  {c.verdict}"
    )


if __name__ == "__main__":
    main()
