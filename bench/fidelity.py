"""The ground checks of docs/simulator-fidelity.md as tables: the reference configuration
(kube-default x knative) on the evaluation split of each bundled cluster and seed, and each
part of a simulated cold start beside its published range.

    python -m bench.fidelity                   # seeds 1-10 on small, medium, large
    python -m bench.fidelity --trace DIR --seeds 3
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from simulator import compare, fidelity


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=compare.BUNDLED_TRACE)
    parser.add_argument("--clusters", default="small,medium,large")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = fidelity.reference_runs(
        args.trace, args.clusters.split(","), range(1, args.seeds + 1), workers=args.workers
    )
    if args.json:
        print(json.dumps({"runs": rows, "summary": fidelity.summary(rows)}, indent=1))
        return
    print("| cluster | seed | GPU fns | invocations | timed out | cold p50 s | cold p99 s | capacity p99 s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['cluster']} | {r['seed']} | {r['gpu_functions']} | {r['invocations']:,} | "
            f"{r['timed_out_requests']} ({100 * r['timed_out_share']:.4f} %) | "
            f"{r['cold_start_latency_p50_s']:.2f} | {r['cold_start_latency_p99_s']:.1f} | "
            f"{r['capacity_wait_p99_s']:.1f} |"
        )
    print()
    print("| part | simulated s | published s | source |")
    print("| --- | --- | --- | --- |")
    for part in fidelity.COLD_START_PARTS:
        low, high = part.simulated_s
        simulated = f"{low:g}" if low == high else f"{low:.1f}-{high:.1f}"
        print(
            f"| {part.name} | {simulated} | {part.published_s[0]:g}-{part.published_s[1]:g} | {part.source} |"
        )


if __name__ == "__main__":
    main()
