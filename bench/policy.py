"""Placement policy latency: ONNX Runtime inference and whole `score` calls, per cluster size.

    python -m bench.policy                 # CPU, 100 / 1,000 / 10,000 nodes
    python -m bench.policy --extender      # and the extender benchmark with the ONNX policy

`inference` is the model alone (features already encoded) on the rows it scores: every node,
or a shortlisting residual model's shortlist; `encode` encodes those rows; `score` is what the
extender pays per request: its base, feature encoding and inference (or a heuristic's
arithmetic). Target: inference p50 <= 0.2 ms at 1,000 nodes on CPU.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from bench import extender, synthetic
from plugin import convert
from plugin.cluster import ClusterCache
from policies import features, onnx_policy, registry
from policies.types import NodeTable, PodRequest

SIZES = (100, 1_000, 10_000)
INFERENCE_TARGET_MS = 0.2  # p50 at 1,000 nodes


def timed(call: Callable[[], object], seconds: float) -> np.ndarray:
    for _ in range(20):  # warm-up: allocations, ORT's first-run planning
        call()
    samples = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return np.asarray(samples) * 1000.0


def table_and_pod(size: int) -> tuple[NodeTable, PodRequest]:
    nodes, pods = synthetic.cluster(size, seed=size)
    table = ClusterCache.from_objects(nodes, pods).snapshot.nodes
    pod = convert.pod_request(synthetic.knative_pod("p", service="s", image=synthetic.image_ref(3)))
    return table, pod


def run(sizes: tuple[int, ...], seconds: float, model: Path, device: str) -> list[dict[str, object]]:
    learned = onnx_policy.OnnxPolicy.open(model, device=device)
    rows: list[dict[str, object]] = []
    for size in sizes:
        table, pod = table_and_pod(size)
        base = learned.base
        scored = base.shortlist(base.logits(pod, table)) if base is not None else None
        observation = features.encode(pod, table, rows=scored)
        inputs = {"nodes": observation.nodes, "pod": observation.pod, "cluster": observation.cluster}
        cases: list[tuple[str, str, Callable[[], object]]] = [
            ("onnx", "inference", partial(learned.session.run, None, inputs)),
            ("onnx", "encode", partial(features.encode, pod, table, rows=scored)),
            ("onnx", "score", partial(learned.score, pod, table)),
        ]
        for name in ("kube-default", "tuned"):
            cases.append((name, "score", partial(registry.load(name).policy.score, pod, table)))
        for name, part, call in cases:
            ms = timed(call, seconds)
            row: dict[str, object] = {
                "policy": name,
                "part": part,
                "nodes": size,
                "scored": len(observation.nodes) if name == "onnx" and part != "score" else size,
                "provider": learned.provider if name == "onnx" else "numpy",
                "p50_ms": round(float(np.percentile(ms, 50)), 4),
                "p99_ms": round(float(np.percentile(ms, 99)), 4),
            }
            if (name, part, size) == ("onnx", "inference", 1_000):
                met = float(np.percentile(ms, 50)) <= INFERENCE_TARGET_MS
                row["target"] = f"p50 <= {INFERENCE_TARGET_MS} ms: {'met' if met else 'MISSED'}"
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, action="append", help="node counts (default: 100 1000 10000)")
    parser.add_argument("--seconds", type=float, default=2.0, help="measuring time per row")
    parser.add_argument("--model", type=Path, default=onnx_policy.DEFAULT_MODEL)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda", "auto"))
    parser.add_argument("--extender", action="store_true", help="also the extender benchmark with onnx")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = run(tuple(args.nodes or SIZES), args.seconds, args.model, args.device)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(
            f"{'policy':<13} {'part':<10} {'nodes':>6} {'scored':>6} {'provider':<22} {'p50 ms':>8} "
            f"{'p99 ms':>8}  target"
        )
        for r in rows:
            print(
                f"{r['policy']!s:<13} {r['part']!s:<10} {r['nodes']!s:>6} {r['scored']!s:>6} "
                f"{r['provider']!s:<22} {r['p50_ms']!s:>8} {r['p99_ms']!s:>8}  {r.get('target', '')}"
            )
    if args.extender:
        print("\nextender with the onnx policy (targets as in bench.extender):")
        for row in extender.run((500, 1000, 5000), ("prioritize",), 3.0, False, policy="onnx"):
            print(
                f"prioritize {row.nodes:>6} p50 {row.p50_ms:.2f} ms  p99 {row.p99_ms:.2f} ms  "
                f"{row.calls_per_s:.0f}/s  {row.target}"
            )


if __name__ == "__main__":
    main()
