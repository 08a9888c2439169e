"""Write the small, seeded slice of the shared Azure 2019 rows that ships with the repository.

    python -m bench.make_trace_slice --trace ../shared/data/traces/azure2019_invitro

Per population: every rarely invoked function (< 24 a day: the ones keep-alive policies are
for) and 15 functions from each decile of daily invocations, those the sampler weighted
(`occ_ref_samples` > 0) first, so both the unweighted and the weighted views have rows.
The slice keeps the source format, so the same loader reads both.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import random
from pathlib import Path

from simulator import traces

OUT = Path(__file__).resolve().parent.parent / "simulator" / "data" / "azure2019_slice"
PER_DECILE = 15
RARE_PER_DAY = 24


def choose(rows: list[dict[str, str]], seed: int) -> set[str]:
    rng = random.Random(seed)
    chosen: set[str] = set()
    for population in traces.POPULATIONS:
        members = sorted(
            (r for r in rows if r["population"] == population), key=lambda r: int(r["inv_sum_day"])
        )
        chosen |= {r["func_id"] for r in members if int(r["inv_sum_day"]) < RARE_PER_DAY}
        for decile in range(10):
            part = members[len(members) * decile // 10 : len(members) * (decile + 1) // 10]
            rng.shuffle(part)
            part.sort(key=lambda r: float(r["occ_ref_samples"]) == 0)  # weighted rows first, stable
            chosen |= {r["func_id"] for r in part[:PER_DECILE]}
    return chosen


def copy_rows(source: Path, target: Path, keep: set[str]) -> int:
    with gzip.open(source, "rt", newline="") as src, gzip.open(target, "wt", newline="") as dst:
        reader, writer = csv.reader(src), csv.writer(dst, lineterminator="\n")
        header = next(reader)
        writer.writerow(header)
        key = header.index("func_id")
        kept = 0
        for row in reader:
            if row[key] in keep:
                writer.writerow(row)
                kept += 1
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=2019)
    args = parser.parse_args()
    with gzip.open(args.trace / traces.INVOCATIONS, "rt", newline="") as handle:
        meta = [
            dict(zip(("population", "func_id", "occ_ref_samples", "occ", "inv_sum_day"), row[:5]))
            for row in list(csv.reader(handle))[1:]
        ]
    keep = choose(meta, args.seed)
    OUT.mkdir(parents=True, exist_ok=True)
    for name in (traces.INVOCATIONS, traces.DURATIONS, traces.MEMORY):
        print(name, copy_rows(args.trace / name, OUT / name, keep))


if __name__ == "__main__":
    main()
