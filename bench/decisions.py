"""The closed loop's record: the size of a day's decisions for a 1,000-function cluster.

    python -m bench.decisions [--functions 1000] [--cluster large] [--seed 1]

A simulated day of that many functions (drawn by weight from the shared trace when it is beside
the repository, else the bundled slice) gives the placements a day asks for and the mean node
count (the candidates each decision records, with `nodeCacheCapable`). That many records, each
of a pod on a synthetic cluster of that size encoded as the recorder encodes them, go into a
fresh database: its size is the day's, before the retention's trimming.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import synthetic
from bench.simulator import SHARED_TRACE
from plugin import convert
from plugin.cluster import ClusterCache
from policies import features, heuristics
from policies.decision_records import DecisionStore, Record
from simulator import compare, evaluation, report, traces


def day(functions: int, cluster: str, seed: int) -> tuple[int, float, str]:
    """(placements, mean nodes, trace) of a simulated day."""
    path = SHARED_TRACE if (SHARED_TRACE / traces.INVOCATIONS).is_file() else compare.BUNDLED_TRACE
    options = compare.Options(functions=functions, weighted=True, seed=seed, cluster=cluster)
    trace = compare.select(traces.load(path), options)
    result = evaluation.simulate(trace, cluster, seed, heuristics.kube_default())
    entry = report.cluster_entry(result, trace.weights, trace.minutes * 60.0)
    return result.pods_started, float(entry["nodes_mean"]), path.name


def size_of(placements: int, nodes: int) -> int:
    """Bytes of a database holding `placements` records of `nodes` candidates each."""
    node_objects, pod_objects = synthetic.cluster(nodes, seed=nodes)
    table = ClusterCache.from_objects(node_objects, pod_objects).snapshot.nodes
    names = [str(n) for n in table.names]
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as folder:
        store = DecisionStore(Path(folder) / "decisions.db")
        for first in range(0, placements, 1000):
            batch = []
            for i in range(first, min(first + 1000, placements)):
                pod = convert.pod_request(synthetic.pending_pod(i))
                feasible = rng.random(len(table)) < 0.9
                chosen = int(np.flatnonzero(feasible)[0])
                batch.append(
                    Record(
                        uid=pod.uid,
                        at=time.time(),
                        function=f"ns/f{i % 1000}",
                        priority=pod.priority,
                        policy="onnx",
                        model="0" * 12,
                        feature_schema=features.SCHEMA_HASH,
                        node=names[chosen],
                        chosen=chosen,
                        names=names,
                        observation=features.encode(pod, table, feasible),
                        mask=feasible,
                        probabilities=(feasible / feasible.sum()).astype(np.float32),
                    )
                )
            store.write(batch)
        store.observe([(f"u{i}", 0.0, 2.0, 0.5, 1.5) for i in range(placements)])
        store.close()
        return sum(p.stat().st_size for p in Path(folder).iterdir())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--functions", type=int, default=1000)
    parser.add_argument("--cluster", default="large")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    placements, nodes, trace = day(args.functions, args.cluster, args.seed)
    size = size_of(placements, max(round(nodes), 1))
    print("| functions | trace | cluster | placements a day | mean nodes | MiB a day | KiB a placement |")
    print("| ---: | --- | --- | ---: | ---: | ---: | ---: |")
    print(
        f"| {args.functions:,} | {trace} | {args.cluster} | {placements:,} | {nodes:.1f} | "
        f"{size / 2**20:.1f} | {size / max(placements, 1) / 1024:.2f} |"
    )


if __name__ == "__main__":
    main()
