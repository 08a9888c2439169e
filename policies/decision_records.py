"""Placements the service served, as its policy saw them, and what became of each pod.

One row per bound pod in the history database's `decisions` table: the candidates' feature
rows exactly as `features.encode` gives them to the model (with the schema's hash), the node
the pod was bound to, the policy and the hash of the file it served from, and the policy's
probabilities over the candidates where it has them (the learned policy's softmax; none for a
heuristic). What became of the pod arrives later, from the pod's events, into
`decision_outcomes`: creation to Ready, and its parts (creation to bound, bound to Ready); on
read, whether its class's start-delay SLA held. `kdrl train --from-decisions` reads both back
(`read`). Bounded: rows older than the retention, and the oldest beyond `max_rows`, are
deleted (`trim`).
"""

from __future__ import annotations

import json
import sqlite3
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from policies import features
from policies.objectives import SLA_TARGET_S
from policies.types import Priority

SCHEMA = """
CREATE TABLE IF NOT EXISTS decisions (uid TEXT PRIMARY KEY, at REAL NOT NULL,
    function TEXT NOT NULL, priority TEXT NOT NULL, policy TEXT NOT NULL, model TEXT NOT NULL,
    feature_schema TEXT NOT NULL, node TEXT NOT NULL, chosen INTEGER NOT NULL,
    names BLOB NOT NULL, features BLOB NOT NULL, probabilities BLOB);
CREATE INDEX IF NOT EXISTS decisions_at ON decisions(at);
CREATE TABLE IF NOT EXISTS decision_outcomes (uid TEXT PRIMARY KEY, at REAL NOT NULL,
    start_s REAL NOT NULL, scheduling_s REAL, startup_s REAL);
"""


FAST = 1  # zlib level: a third of level 6's time for 1.4x its size (the writer shares the server's GIL)


class RecordsError(ValueError):
    """A decisions database that cannot be read: missing, corrupt, or without the tables."""


@dataclass(frozen=True)
class Record:
    """One served placement. `chosen` is the bound node's row among the candidates (-1 when
    it was not one of them); `probabilities` is None where the policy has none."""

    uid: str
    at: float
    function: str
    priority: Priority
    policy: str
    model: str
    feature_schema: str
    node: str
    chosen: int
    names: list[str]
    observation: features.Observation
    mask: npt.NDArray[np.bool_]
    probabilities: npt.NDArray[np.float32] | None = None
    start_s: float | None = None  # creation to Ready, once observed
    scheduling_s: float | None = None
    startup_s: float | None = None
    sla_met: bool | None = None


def meets_sla(priority: Priority, start_s: float) -> bool:
    return start_s <= SLA_TARGET_S[priority]


def _pack(observation: features.Observation, mask: npt.NDArray[np.bool_]) -> bytes:
    parts = [observation.nodes.astype(np.float32).ravel(), observation.pod, observation.cluster]
    return zlib.compress(
        np.concatenate([p.astype(np.float32) for p in parts]).tobytes() + mask.astype(np.uint8).tobytes(),
        FAST,
    )


def _pack_probabilities(probabilities: npt.NDArray[np.float32] | None) -> bytes | None:
    return None if probabilities is None else zlib.compress(probabilities.astype(np.float32).tobytes(), FAST)


def _unpack(blob: bytes, rows: int) -> tuple[features.Observation, npt.NDArray[np.bool_]]:
    raw = zlib.decompress(blob)
    width = rows * len(features.NODE_FEATURES) + len(features.POD_FEATURES) + len(features.CLUSTER_FEATURES)
    values = np.frombuffer(raw[: width * 4], dtype=np.float32)
    mask = np.frombuffer(raw[width * 4 :], dtype=np.uint8).astype(bool)
    if mask.size != rows:
        raise ValueError(f"{rows} candidates but {mask.size} mask entries")
    nodes = values[: rows * len(features.NODE_FEATURES)].reshape(rows, len(features.NODE_FEATURES))
    pod = values[nodes.size : nodes.size + len(features.POD_FEATURES)]
    cluster = values[nodes.size + pod.size :]
    return features.Observation(nodes=nodes.copy(), pod=pod.copy(), cluster=cluster.copy()), mask


def row(r: Record) -> tuple[Any, ...]:
    """A record as the `decisions` table stores it (features and names compressed)."""
    return (
        r.uid,
        r.at,
        r.function,
        r.priority.value,
        r.policy,
        r.model,
        r.feature_schema,
        r.node,
        r.chosen,
        zlib.compress(json.dumps(r.names).encode(), FAST),
        _pack(r.observation, r.mask),
        _pack_probabilities(r.probabilities),
    )


class DecisionStore:
    """The two tables, in the SQLite file at `path` (the history database, beside its tables)."""

    def __init__(self, path: Path | str, *, create: bool = True) -> None:
        if not create and not Path(path).is_file():
            raise RecordsError(f"{path}: no such decisions database")
        try:
            self._db = sqlite3.connect(str(path), check_same_thread=False)
            self._db.execute("PRAGMA busy_timeout=5000")  # the history's writer shares the file
            if create:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.executescript(SCHEMA)
            self._db.execute("SELECT count(*) FROM decisions").fetchone()
        except sqlite3.DatabaseError as error:
            raise RecordsError(f"{path}: not a decisions database ({error})") from error

    def write(self, records: list[Record]) -> None:
        self.write_rows([row(r) for r in records])

    def write_rows(self, rows: list[tuple[Any, ...]]) -> None:
        """Rows made by `row` (apart, so a caller can make them where it likes)."""
        with self._db:
            self._db.executemany("INSERT OR REPLACE INTO decisions VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", rows)

    def observe(self, outcomes: list[tuple[str, float, float, float | None, float | None]]) -> None:
        """(uid, at, start_s, scheduling_s, startup_s) of pods now Ready; a decision written
        later meets its outcome all the same (the tables are joined on read)."""
        with self._db:
            self._db.executemany("INSERT OR IGNORE INTO decision_outcomes VALUES (?,?,?,?,?)", outcomes)

    def trim(self, *, now: float, retention_s: float, max_rows: int) -> int:
        """Delete what is past the retention or beyond the newest `max_rows`; returns rows deleted."""
        with self._db:
            deleted = self._db.execute("DELETE FROM decisions WHERE at < ?", (now - retention_s,)).rowcount
            deleted += self._db.execute(
                "DELETE FROM decisions WHERE uid IN "
                "(SELECT uid FROM decisions ORDER BY at DESC LIMIT -1 OFFSET ?)",
                (max_rows,),
            ).rowcount
            self._db.execute(
                "DELETE FROM decision_outcomes WHERE at < ? OR (uid NOT IN (SELECT uid FROM decisions) "
                "AND at < ?)",
                (now - retention_s, now - 3600.0),  # an outcome waits an hour for its decision
            )
        return int(deleted)

    def export(self, path: Path | str, *, since: float) -> int:
        """The decisions from `since` on, with their outcomes, into a new database at `path`
        (what `kdrl loop` learns from, away from the service); returns the decisions copied."""
        DecisionStore(path).close()  # the tables, empty
        self._db.execute("ATTACH DATABASE ? AS export", (str(path),))
        try:
            copied = self._db.execute(
                "INSERT OR REPLACE INTO export.decisions SELECT * FROM main.decisions WHERE at >= ?", (since,)
            ).rowcount
            self._db.execute(
                "INSERT OR REPLACE INTO export.decision_outcomes SELECT o.* FROM main.decision_outcomes o "
                "JOIN main.decisions d ON d.uid = o.uid WHERE d.at >= ?",
                (since,),
            )
            self._db.commit()
        finally:
            self._db.rollback()  # nothing, after a commit; else what the failure left half done
            self._db.execute("DETACH DATABASE export")
        return int(copied)

    def __len__(self) -> int:
        return int(self._db.execute("SELECT count(*) FROM decisions").fetchone()[0])

    def read(self, skipped: Counter[str]) -> Iterator[Record]:
        """Every decision of this build's feature schema, oldest first, with its outcome where
        one was observed; rows of another schema or that do not decode are counted in
        `skipped` by reason, not returned."""
        query = (
            "SELECT d.uid, d.at, function, priority, policy, model, feature_schema, node, chosen, names, "
            "features, probabilities, start_s, scheduling_s, startup_s "
            "FROM decisions d LEFT JOIN decision_outcomes o ON o.uid = d.uid ORDER BY d.at"
        )
        try:
            for row in self._db.execute(query):
                if row[6] != features.SCHEMA_HASH:
                    skipped["another feature schema"] += 1
                    continue
                try:
                    yield _record(row)
                except (ValueError, TypeError, zlib.error):
                    skipped["undecodable row"] += 1
        except sqlite3.DatabaseError as error:
            raise RecordsError(f"decisions database unreadable: {error}") from error

    def close(self) -> None:
        self._db.close()


def _record(row: tuple[Any, ...]) -> Record:
    uid, at, function, priority, policy, model, schema, node, chosen, names, blob, probs = row[:12]
    start_s, scheduling_s, startup_s = row[12:]
    candidates = json.loads(zlib.decompress(bytes(names)))
    observation, mask = _unpack(bytes(blob), len(candidates))
    return Record(
        uid=str(uid),
        at=float(at),
        function=str(function),
        priority=Priority(priority),
        policy=str(policy),
        model=str(model),
        feature_schema=str(schema),
        node=str(node),
        chosen=int(chosen),
        names=candidates,
        observation=observation,
        mask=mask,
        probabilities=None
        if probs is None
        else np.frombuffer(zlib.decompress(bytes(probs)), dtype=np.float32),
        start_s=None if start_s is None else float(start_s),
        scheduling_s=None if scheduling_s is None else float(scheduling_s),
        startup_s=None if startup_s is None else float(startup_s),
        sla_met=None if start_s is None else meets_sla(Priority(priority), float(start_s)),
    )
