"""Azure Functions 2019 traces in the normalized format of `shared/data/traces` (its README).

A trace folder holds three gzipped CSVs, joined on `func_id`:
- `invocations_per_minute.csv.gz`: `population, func_id, occ_ref_samples, occ_all_invitro_files,
  inv_sum_day, first_source, 1..1440`, the invocations completed in each minute of one day;
- `durations_ms.csv.gz`: execution-time statistics (`percentile_Average_{0,1,25,50,75,99,100}`);
- `memory_mb.csv.gz`: allocated memory (`AverageAllocatedMb_pct{1,5,25,50,75,95,99,100}`).
Durations and memory are marginal distributions, not that function's own values (caveat 2).
Any malformed row is a `TraceError` naming the file, the line and the field.
"""

from __future__ import annotations

import csv
import gzip
import io
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import numpy.typing as npt

MINUTES_PER_DAY = 1440
INVOCATIONS = "invocations_per_minute.csv.gz"
DURATIONS = "durations_ms.csv.gz"
MEMORY = "memory_mb.csv.gz"
POPULATIONS = ("heavy", "light")
DURATION_LEVELS = (0.0, 0.01, 0.25, 0.50, 0.75, 0.99, 1.0)
DURATION_COLUMNS = tuple(f"percentile_Average_{p}" for p in (0, 1, 25, 50, 75, 99, 100))
MEMORY_LEVELS = (0.01, 0.05, 0.25, 0.50, 0.75, 0.95, 0.99, 1.0)
MEMORY_COLUMNS = tuple(f"AverageAllocatedMb_pct{p}" for p in (1, 5, 25, 50, 75, 95, 99, 100))
MAX_PER_MINUTE = 10**8  # far above any real function (the busiest rows reach ~10^5 a minute)


# The trace day split in two: learning and tuning see only the first half, evaluation the second.
TRAIN_MINUTES = (0, 720)
EVAL_MINUTES = (720, 1440)


class TraceError(ValueError):
    """A trace file that is missing or malformed; the message names file, line and field."""


@dataclass(frozen=True, eq=False)
class Trace:
    """One row per function: identity, weight, per-minute counts, duration and memory quantiles."""

    func_ids: tuple[str, ...]
    populations: tuple[str, ...]
    weights: npt.NDArray[np.float64]  # occ_ref_samples: restores the sampler's population mix
    counts: npt.NDArray[np.int64]  # (functions, minutes)
    duration_ms: npt.NDArray[np.float64]  # (functions, 7) at DURATION_LEVELS
    memory_mb: npt.NDArray[np.float64]  # (functions, 8) at MEMORY_LEVELS
    duration_count: npt.NDArray[np.float64]  # the duration row's `Count`: its source's invocations

    def __len__(self) -> int:
        return len(self.func_ids)

    @property
    def minutes(self) -> int:
        return int(self.counts.shape[1])

    def subset(self, rows: npt.NDArray[np.int64] | list[int]) -> Trace:
        index = np.asarray(rows, dtype=np.int64)
        return Trace(
            func_ids=tuple(self.func_ids[i] for i in index),
            populations=tuple(self.populations[i] for i in index),
            weights=self.weights[index],
            counts=self.counts[index],
            duration_ms=self.duration_ms[index],
            memory_mb=self.memory_mb[index],
            duration_count=self.duration_count[index],
        )

    def scaled(self, factor: float) -> Trace:
        """Every minute's invocations times `factor`, rounded: a busier (or quieter) day of the
        same functions."""
        if factor == 1.0:
            return self
        counts = np.round(self.counts * factor).astype(np.int64)
        return replace(self, counts=counts)

    def window(self, start_minute: int, end_minute: int) -> Trace:
        """The same functions over minutes [start, end): e.g. the first 12 hours for training."""
        return Trace(
            func_ids=self.func_ids,
            populations=self.populations,
            weights=self.weights,
            counts=self.counts[:, start_minute:end_minute],
            duration_ms=self.duration_ms,
            memory_mb=self.memory_mb,
            duration_count=self.duration_count,
        )


def load(path: Path) -> Trace:
    """The trace in folder `path` (or the folder of the invocations file `path`)."""
    folder = path.parent if path.is_file() else path
    invocations = _read_invocations(folder / INVOCATIONS)
    durations = _read_quantiles(folder / DURATIONS, ("Count", *DURATION_COLUMNS))
    memory = _read_quantiles(folder / MEMORY, MEMORY_COLUMNS)
    func_ids, populations, weights, counts = invocations
    for name, table in ((DURATIONS, durations), (MEMORY, memory)):
        missing = [f for f in func_ids if f not in table]
        if missing:
            raise TraceError(f"{folder / name}: no row for func_id {missing[0]} ({len(missing)} missing)")
    return Trace(
        func_ids=tuple(func_ids),
        populations=tuple(populations),
        weights=np.asarray(weights, dtype=np.float64),
        counts=counts,
        duration_ms=np.array([durations[f][1:] for f in func_ids]).reshape(
            len(func_ids), len(DURATION_COLUMNS)
        ),
        memory_mb=np.array([memory[f] for f in func_ids]).reshape(len(func_ids), len(MEMORY_COLUMNS)),
        duration_count=np.array([durations[f][0] for f in func_ids], dtype=np.float64),
    )


def _rows(path: Path) -> Iterator[tuple[int, list[str], list[str]]]:
    """(line number, header, row) for each data row of a gzipped CSV."""
    try:
        with gzip.open(path, "rt", newline="") as handle:
            reader = csv.reader(handle)
            header = next(reader, None)
            if header is None:
                raise TraceError(f"{path}: empty file")
            for row in reader:
                yield reader.line_num, header, row
    except FileNotFoundError as error:
        raise TraceError(f"{path}: no such file") from error
    except (OSError, EOFError, csv.Error, UnicodeDecodeError) as error:
        raise TraceError(f"{path}: unreadable: {error}") from error


def _read_invocations(path: Path) -> tuple[list[str], list[str], list[float], npt.NDArray[np.int64]]:
    func_ids: list[str] = []
    populations: list[str] = []
    weights: list[float] = []
    counts: list[npt.NDArray[np.int64]] = []
    for line, header, row in _rows(path):
        columns = _require(path, line, header, ("population", "func_id", "occ_ref_samples", "1"))
        first_minute = columns["1"]
        if len(row) != len(header):
            raise TraceError(f"{path}:{line}: {len(row)} fields, the header has {len(header)}")
        population = row[columns["population"]]
        if population not in POPULATIONS:
            raise TraceError(f"{path}:{line}: field population: {population!r} is not heavy or light")
        func_ids.append(row[columns["func_id"]])
        populations.append(population)
        weights.append(_number(path, line, "occ_ref_samples", row[columns["occ_ref_samples"]]))
        counts.append(_minute_counts(path, line, header, row, first_minute))
    if not func_ids:
        raise TraceError(f"{path}: no functions")
    return func_ids, populations, weights, np.vstack(counts)


def _minute_counts(
    path: Path, line: int, header: list[str], row: list[str], first: int
) -> npt.NDArray[np.int64]:
    try:
        values = np.loadtxt(io.StringIO(",".join(row[first:])), delimiter=",", dtype=np.int64, ndmin=1)
    except ValueError:
        for name, raw in zip(header[first:], row[first:]):
            if not raw.strip().isdigit():
                raise TraceError(f"{path}:{line}: field {name}: {raw!r} is not a count") from None
        raise
    negative = np.flatnonzero(values < 0)
    if negative.size:
        name = header[first + int(negative[0])]
        raise TraceError(f"{path}:{line}: field {name}: {values[negative[0]]} is not a count")
    too_big = np.flatnonzero(values > MAX_PER_MINUTE)
    if too_big.size:
        name = header[first + int(too_big[0])]
        raise TraceError(
            f"{path}:{line}: field {name}: {values[too_big[0]]} invocations in a minute is absurd"
        )
    return values


def _read_quantiles(path: Path, names: tuple[str, ...]) -> dict[str, list[float]]:
    table: dict[str, list[float]] = {}
    for line, header, row in _rows(path):
        columns = _require(path, line, header, ("func_id", *names))
        values = [
            _number(path, line, name, row[columns[name]] if columns[name] < len(row) else "")
            for name in names
        ]
        quantiles = [v for name, v in zip(names, values) if name != "Count"]
        if any(b < a for a, b in itertools.pairwise(quantiles)):
            raise TraceError(f"{path}:{line}: fields {names[0]}..{names[-1]}: quantiles must not decrease")
        table[row[columns["func_id"]]] = values
    return table


def _require(path: Path, line: int, header: list[str], names: tuple[str, ...]) -> dict[str, int]:
    columns = {name: i for i, name in enumerate(header)}
    for name in names:
        if name not in columns:
            raise TraceError(f"{path}:1: missing column {name}")
    return columns


def _number(path: Path, line: int, field: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise TraceError(f"{path}:{line}: field {field}: {raw!r} is not a number") from None
    if not np.isfinite(value) or value < 0:
        raise TraceError(f"{path}:{line}: field {field}: {raw!r} must be a non-negative number")
    return value
