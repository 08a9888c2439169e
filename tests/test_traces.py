"""The trace loader on small hand-made files: shapes, weights, selection, precise errors."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from simulator import compare, traces

MINUTES = ",".join(str(i) for i in range(1, 1441))


def write_trace(
    folder: Path, rows: list[tuple[str, str, int, list[int]]], *, duration_row: str | None = None
) -> Path:
    """rows: (population, func_id, occ_ref_samples, {minute index: count})."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"population,func_id,occ_ref_samples,occ_all_invitro_files,inv_sum_day,first_source,{MINUTES}"]
    durations = ["population,func_id,Count,Average,Minimum,Maximum," + ",".join(traces.DURATION_COLUMNS)]
    memory = ["population,func_id,SampleCount,AverageAllocatedMb," + ",".join(traces.MEMORY_COLUMNS)]
    for population, func_id, weight, counts in rows:
        lines.append(f"{population},{func_id},{weight},1,{sum(counts)},src," + ",".join(map(str, counts)))
        durations.append(duration_row or f"{population},{func_id},10,100,50,200,50,55,80,100,120,190,200")
        memory.append(f"{population},{func_id},5,128,100,110,120,128,130,140,150,160")
    for name, content in (
        (traces.INVOCATIONS, lines),
        (traces.DURATIONS, durations),
        (traces.MEMORY, memory),
    ):
        with gzip.open(folder / name, "wt") as handle:
            handle.write("\n".join(content) + "\n")
    return folder


def day(**at: int) -> list[int]:
    counts = [0] * 1440
    for minute, count in at.items():
        counts[int(minute.removeprefix("m"))] = count
    return counts


def test_loads_rows_counts_and_quantiles(tmp_path: Path) -> None:
    folder = write_trace(
        tmp_path, [("heavy", "F-h-1", 3, day(m0=2, m5=1)), ("light", "F-l-2", 0, day(m1439=7))]
    )
    trace = traces.load(folder)
    assert trace.func_ids == ("F-h-1", "F-l-2") and trace.populations == ("heavy", "light")
    assert trace.counts.shape == (2, 1440) and trace.counts[0, 0] == 2 and trace.counts[1, 1439] == 7
    assert list(trace.weights) == [3.0, 0.0]
    assert list(trace.duration_ms[0]) == [50, 55, 80, 100, 120, 190, 200]
    assert trace.memory_mb[0, 3] == 128 and trace.duration_count[0] == 10
    assert traces.load(folder / traces.INVOCATIONS).func_ids == trace.func_ids  # a file path works too
    assert trace.window(0, 720).minutes == 720


def test_bundled_slice_has_both_populations_and_rare_functions() -> None:
    trace = traces.load(compare.BUNDLED_TRACE)
    populations = np.asarray(trace.populations)
    daily = trace.counts.sum(axis=1)
    for population in traces.POPULATIONS:
        members = populations == population
        assert members.sum() >= 100
        assert (daily[members] < 24).sum() >= 10  # rarely invoked functions are in
        assert (trace.weights[members] > 0).sum() >= 50  # the weighted view has rows


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        ("count", r"invocations_per_minute.csv.gz:2: field 3: 'x' is not a count"),
        ("population", r"invocations_per_minute.csv.gz:2: field population: 'medium'"),
        ("short", r"invocations_per_minute.csv.gz:2: 1443 fields, the header has 1446"),
        (
            "quantiles",
            r"durations_ms.csv.gz:2: fields Count..percentile_Average_100: quantiles must not decrease",
        ),
        ("weight", r"invocations_per_minute.csv.gz:2: field occ_ref_samples: '-1'"),
        ("negative", r"invocations_per_minute.csv.gz:2: field 3: -4 is not a count"),
    ],
)
def test_malformed_files_name_file_line_and_field(tmp_path: Path, breakage: str, message: str) -> None:
    counts = day(m0=1)
    population, _weight, duration_row = "heavy", "1", None
    if breakage == "population":
        population = "medium"
    if breakage == "quantiles":
        duration_row = "heavy,F-h-1,10,100,50,200,50,55,80,100,90,190,200"
    folder = write_trace(tmp_path, [(population, "F-h-1", 1, counts)], duration_row=duration_row)
    if breakage in ("count", "short", "weight", "negative"):
        path = folder / traces.INVOCATIONS
        with gzip.open(path, "rt") as handle:
            header, row = handle.read().splitlines()
        fields = row.split(",")
        if breakage in ("count", "negative"):
            fields[8] = "x" if breakage == "count" else "-4"
        elif breakage == "short":
            fields = fields[:-3]
        else:
            fields[2] = "-1"
        with gzip.open(path, "wt") as handle:
            handle.write(header + "\n" + ",".join(fields) + "\n")
    with pytest.raises(traces.TraceError, match=message):
        traces.load(folder)


def test_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(traces.TraceError, match="no such file"):
        traces.load(tmp_path / "nowhere")


def test_selection_is_seeded_and_weighted_draws_only_weighted_rows() -> None:
    trace = traces.load(compare.BUNDLED_TRACE)
    options = compare.Options(functions=40, weighted=True, population="light", seed=5)
    first, again = compare.select(trace, options), compare.select(trace, options)
    assert first.func_ids == again.func_ids and len(first) == 40
    assert set(first.populations) == {"light"} and (first.weights > 0).all()
    other = compare.select(trace, compare.Options(functions=40, weighted=True, population="light", seed=6))
    assert other.func_ids != first.func_ids
