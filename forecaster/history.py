"""Per-function invocation history: minute counts in memory, durable in SQLite.

`MinuteCounts` keeps the last two days of per-minute counts of every function in one ring
matrix of uint16 (counts above 65,534 go to a small overflow map), about 5.8 kB a function,
so 10,000 functions fit in ~58 MB. `HistoryStore` is the durable truth: a SQLite database in
WAL mode with minute rows for two days and hourly rows beyond, plus the (source, id) keys of
recent events, so a redelivered event never counts twice, across restarts too, and the losses
that choose each function's answer (`phase.Scores`), so a restart does not forget them. A write
returns only once its transaction is committed. A database that SQLite cannot read is moved
aside (loudly) and a new one started, rather than crash-looping the service.
What this module does not do: parse events, or forecast.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from forecaster.phase import Judged

logger = logging.getLogger(__name__)

MINUTES_KEPT = 2 * 24 * 60  # two days at minute resolution; older minutes roll up to hours
_SATURATED = np.iinfo(np.uint16).max


@dataclass(frozen=True, slots=True)
class Count:
    """`count` invocations of `function` ("namespace/service") in the minute `minute`
    (minutes since the Unix epoch)."""

    function: str
    minute: int
    count: int


@dataclass(frozen=True, slots=True)
class PodChange:
    """What an event says of one Knative pod; times in seconds since the epoch, None unknown."""

    uid: str
    function: str
    revision: str
    created: float
    ready: float | None = None
    deleted: float | None = None
    scheduled: float | None = None  # bound to a node (PodScheduled); not stored, only observed


@dataclass(frozen=True, slots=True)
class ColdStart:
    """One pod's way to Ready, observed once: in total and, when the events told, its parts."""

    uid: str
    function: str
    seconds: float  # creation to Ready
    scheduling_s: float | None  # creation to bound
    startup_s: float | None  # bound to Ready


@dataclass(frozen=True, slots=True)
class Route:
    """The revision a function's traffic goes to (`routingState: active`); None when gone."""

    function: str
    revision: str | None


@dataclass(frozen=True, slots=True)
class Effect:
    """Everything one event changes in the history."""

    counts: Sequence[Count] = ()
    pods: Sequence[PodChange] = ()
    routes: Sequence[Route] = ()

    def __bool__(self) -> bool:
        return bool(self.counts or self.pods or self.routes)


class Lifecycle:
    """Pods and routes as the events told them: scale events and observed cold starts.

    Bounded like `MinuteCounts`, since events can name anything: at most `max_pods` pods (the
    oldest tracked one is let go; a pod that lives on is told again by its next event) and
    observed cold starts of at most `max_functions` functions (least recently observed let go)."""

    RECENT = 100  # observed cold starts kept per function

    def __init__(self, *, max_pods: int = 100_000, max_functions: int = 20_000) -> None:
        self.pods: dict[str, PodChange] = {}
        self.routes: dict[str, str] = {}
        self.cold_starts_s: OrderedDict[str, list[float]] = OrderedDict()
        self.max_pods, self.max_functions = max_pods, max_functions

    def apply(self, effect: Effect) -> list[ColdStart]:
        """Take in what an event changed; returns the cold starts it completed."""
        completed: list[ColdStart] = []
        for change in effect.pods:
            known = self.pods.get(change.uid)
            merged = (
                change
                if known is None
                else PodChange(
                    uid=change.uid,
                    function=change.function,
                    revision=change.revision,
                    created=min(known.created, change.created),
                    ready=known.ready if known.ready is not None else change.ready,
                    deleted=known.deleted if known.deleted is not None else change.deleted,
                    scheduled=known.scheduled if known.scheduled is not None else change.scheduled,
                )
            )
            if merged.ready is not None and (known is None or known.ready is None):
                completed.append(_cold_start(merged, merged.ready))
                observed = self.cold_starts_s.setdefault(merged.function, [])
                self.cold_starts_s.move_to_end(merged.function)
                observed.append(completed[-1].seconds)
                del observed[: -self.RECENT]
                if len(self.cold_starts_s) > self.max_functions:
                    self.cold_starts_s.popitem(last=False)
            if merged.deleted is not None:
                self.pods.pop(change.uid, None)
            else:
                self.pods[change.uid] = merged
                if len(self.pods) > self.max_pods:
                    del self.pods[next(iter(self.pods))]
        for route in effect.routes:
            if route.revision is None:
                self.routes.pop(route.function, None)
            else:
                self.routes[route.function] = route.revision
        return completed

    def running(self, function: str) -> int:
        return sum(1 for p in self.pods.values() if p.function == function)


def _cold_start(pod: PodChange, ready: float) -> ColdStart:
    scheduled = pod.scheduled if pod.scheduled is not None and pod.created <= pod.scheduled <= ready else None
    return ColdStart(
        uid=pod.uid,
        function=pod.function,
        seconds=max(ready - pod.created, 0.0),
        scheduling_s=None if scheduled is None else scheduled - pod.created,
        startup_s=None if scheduled is None else ready - scheduled,
    )


class MinuteCounts:
    """The last `MINUTES_KEPT` minutes of every function's counts, in blocks of ring rows.

    Rows live in fixed blocks of `BLOCK_ROWS` functions, so growing never copies (no
    temporary doubling of memory). With a `capacity`, at most that many functions are held:
    a new one takes the row of the least recently counted function that `keep` does not
    protect (the service protects the functions Knative knows, so a flood of made-up names
    evicts only made-up names); when every held function is protected, the new one is refused.
    Either way the durable store keeps every count: memory forgets, the history does not.

    The service writes from the event loop and forecasts read (`functions`, `series`) on a worker
    thread, without a lock. What a read can see of a write under way: `functions` is one C-level
    copy of the dict; `series` bounds its window by the row's newest minute as read first, so a
    write of a newer minute can only touch the window's oldest slots (the ring wraps: those
    minutes are leaving it), which may read as 0 or as the new count; a row reused for another
    function mid-read gives the evicted one's last series that function's counts."""

    BLOCK_ROWS = 1024

    def __init__(self, capacity: int | None = None, keep: Callable[[str], bool] = lambda _: False) -> None:
        self.capacity = capacity
        self.keep = keep
        self.evicted = 0  # functions forgotten to make room for another
        self.refused = 0  # counts of functions not taken in: full of protected functions
        self._rows: dict[str, int] = {}
        self._blocks: list[npt.NDArray[np.uint16]] = []
        self._latest: list[int] = []  # newest minute written per row, -1 for none
        self._overflow: dict[tuple[int, int], int] = {}
        self._free: list[int] = []  # rows of evicted functions, reused first
        self._evictable: OrderedDict[str, None] = OrderedDict()  # least recently counted first

    @property
    def functions(self) -> list[str]:
        return list(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._blocks)

    def add(self, function: str, minute: int, count: int) -> None:
        row = self._row(function)
        if row is None:
            self.refused += 1
            return
        if function in self._evictable:
            self._evictable.move_to_end(function)
        latest = self._latest[row]
        if latest >= 0 and minute <= latest - MINUTES_KEPT:
            return  # older than the ring: only the durable store keeps it (as hours)
        if minute > latest:
            self._clear(row, latest, minute)
            self._latest[row] = minute
        slot = minute % MINUTES_KEPT
        total = self._get(row, slot) + count
        ring = self._ring(row)
        if total >= _SATURATED:
            self._overflow[(row, slot)] = total
            ring[slot] = _SATURATED
        else:
            self._overflow.pop((row, slot), None)
            ring[slot] = total

    def load(self, function: str, minutes: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]) -> None:
        """A function's distinct minutes at once, as `add` would take them one by one (the
        rebuild from the database: per row, `add` costs more than SQLite's read)."""
        if function in self._rows or len(minutes) == 0:
            for minute, count in zip(minutes.tolist(), counts.tolist(), strict=True):
                self.add(function, minute, count)
            return
        row = self._row(function)
        if row is None:
            self.refused += len(minutes)
            return
        newest = int(minutes.max())
        kept = minutes > newest - MINUTES_KEPT
        slots, values = minutes[kept] % MINUTES_KEPT, counts[kept]
        ring = self._ring(row)
        self._clear(row, -1, newest)
        ring[slots] = np.minimum(values, _SATURATED)
        big = values >= _SATURATED
        self._overflow.update(
            {(row, slot): value for slot, value in zip(slots[big].tolist(), values[big].tolist())}
        )
        self._latest[row] = newest

    def series(self, function: str, end_minute: int, minutes: int) -> npt.NDArray[np.int64]:
        """Counts for minutes [end - minutes, end), zeros where nothing (or nothing kept)."""
        out = np.zeros(minutes, dtype=np.int64)
        row = self._rows.get(function)
        if row is None:
            return out
        latest = self._latest[row]
        start = max(end_minute - minutes, latest - MINUTES_KEPT + 1)
        stop = min(end_minute, latest + 1)
        if stop > start:
            kept = np.arange(start, stop)
            values = self._ring(row)[kept % MINUTES_KEPT].astype(np.int64)
            for i in np.flatnonzero(values == _SATURATED):
                values[i] = self._overflow.get((row, int(kept[i]) % MINUTES_KEPT), _SATURATED)
            out[start - (end_minute - minutes) : stop - (end_minute - minutes)] = values
        return out

    def _ring(self, row: int) -> npt.NDArray[np.uint16]:
        ring: npt.NDArray[np.uint16] = self._blocks[row // self.BLOCK_ROWS][row % self.BLOCK_ROWS]
        return ring

    def _get(self, row: int, slot: int) -> int:
        value = int(self._ring(row)[slot])
        return self._overflow.get((row, slot), value) if value == _SATURATED else value

    def _clear(self, row: int, latest: int, minute: int) -> None:
        """Zero the slots of minutes after `latest` up to `minute` (they had no invocations)."""
        ring = self._ring(row)
        if latest < 0 or minute - latest >= MINUTES_KEPT:
            ring[:] = 0
            self._overflow = {k: v for k, v in self._overflow.items() if k[0] != row}
            return
        slots = np.arange(latest + 1, minute + 1) % MINUTES_KEPT
        ring[slots] = 0
        for slot in slots.tolist():
            self._overflow.pop((row, slot), None)

    def _row(self, function: str) -> int | None:
        row = self._rows.get(function)
        if row is not None:
            return row
        if self.capacity is not None and len(self._rows) >= self.capacity and not self._evict():
            return None
        if self._free:
            row = self._free.pop()
            self._latest[row] = -1  # the next write clears the ring and its overflow
        else:
            row = len(self._latest)
            if row == len(self._blocks) * self.BLOCK_ROWS:
                self._blocks.append(np.zeros((self.BLOCK_ROWS, MINUTES_KEPT), dtype=np.uint16))
            self._latest.append(-1)
        self._rows[function] = row
        self._evictable[function] = None
        return row

    def _evict(self) -> bool:
        """Forget the least recently counted function `keep` does not protect; False if none.
        A function found protected leaves the queue for good (it is never scanned again)."""
        while self._evictable:
            function, _ = self._evictable.popitem(last=False)
            if self.keep(function):
                continue
            self._free.append(self._rows.pop(function))
            self.evicted += 1
            return True
        return False


class HistoryStore:
    """The durable history: SQLite in WAL mode, one transaction per batch of writes."""

    def __init__(self, path: Path | str, *, dedup_window_s: float = 24 * 3600.0) -> None:
        self.path = Path(path) if str(path) != ":memory:" else None
        self._dedup_window_s = dedup_window_s
        self._db = self._open(str(path))

    def _open(self, location: str) -> sqlite3.Connection:
        try:
            return _connect(location)
        except sqlite3.DatabaseError as error:
            if self.path is None:
                raise
            aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time())}")
            logger.error(
                "history database %s is unreadable (%s); moved to %s, starting empty", self.path, error, aside
            )
            self.path.rename(aside)
            for suffix in ("-wal", "-shm"):
                sidecar = self.path.with_name(self.path.name + suffix)
                if sidecar.exists():
                    sidecar.rename(aside.with_name(aside.name + suffix))
            return _connect(location)

    def record(self, batches: Sequence[tuple[tuple[str, str] | None, Effect]], now: float) -> list[bool]:
        """Commit many events' effects in one transaction (group commit).

        Each batch is (its event's (source, id), or None, its effect). An event already seen
        within the dedup window is skipped. Returns, per batch, whether it was new.
        """
        fresh = []
        with self._db:
            for key, effect in batches:
                if key is not None:
                    inserted = self._db.execute(
                        "INSERT OR IGNORE INTO seen(source, id, at) VALUES (?, ?, ?)", (*key, now)
                    ).rowcount
                    if not inserted:
                        fresh.append(False)
                        continue
                self._db.executemany(
                    "INSERT INTO minutes(function, minute, count) VALUES (?, ?, ?) "
                    "ON CONFLICT(function, minute) DO UPDATE SET count = count + excluded.count",
                    [(c.function, c.minute, c.count) for c in effect.counts],
                )
                self._db.executemany(
                    "INSERT INTO pods(uid, function, revision, created, ready, deleted) "
                    "VALUES (?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT(uid) DO UPDATE SET created = min(created, excluded.created), "
                    "ready = coalesce(ready, excluded.ready), deleted = coalesce(deleted, excluded.deleted)",
                    [(p.uid, p.function, p.revision, p.created, p.ready, p.deleted) for p in effect.pods],
                )
                self._db.executemany(
                    "INSERT INTO routes(function, revision) VALUES (?, ?) "
                    "ON CONFLICT(function) DO UPDATE SET revision = excluded.revision",
                    [(r.function, r.revision) for r in effect.routes],
                )
                fresh.append(True)
        return fresh

    def recency(self, since_minute: int) -> list[str]:
        """Functions with minute rows from `since_minute` on, least recently invoked first."""
        query = (
            "SELECT function, max(minute) AS newest FROM minutes WHERE minute >= ? "
            "GROUP BY function ORDER BY newest, function"
        )
        return [function for function, _ in self._db.execute(query, (since_minute,))]

    def series(self, function: str, since_minute: int) -> npt.NDArray[np.int64]:
        """One function's (minute, count) rows from `since_minute` on, oldest first."""
        query = "SELECT minute, count FROM minutes WHERE function = ? AND minute >= ? ORDER BY minute"
        rows = self._db.execute(query, (function, since_minute)).fetchall()
        return np.array(rows, dtype=np.int64).reshape(-1, 2)

    def lifecycle(self, *, since: float) -> Effect:
        """Pods created since `since` and every route, to rebuild a `Lifecycle`."""
        rows = self._db.execute(
            "SELECT uid, function, revision, created, ready, deleted FROM pods "
            "WHERE created >= ? ORDER BY created",
            (since,),
        )
        pods = [PodChange(*row) for row in rows]
        routes = [Route(f, r) for f, r in self._db.execute("SELECT function, revision FROM routes")]
        return Effect(pods=pods, routes=routes)

    def hours(self, function: str) -> list[tuple[int, int]]:
        """(hour since the epoch, count) rows of one function, rolled up from old minutes."""
        query = "SELECT hour, count FROM hours WHERE function = ? ORDER BY hour"
        return [(h, c) for h, c in self._db.execute(query, (function,))]

    def compact(self, *, now_minute: int, now: float) -> None:
        """Roll minutes older than two days up into hours; forget old dedup keys."""
        cutoff = now_minute - MINUTES_KEPT
        with self._db:
            self._db.execute(
                "INSERT INTO hours(function, hour, count) "
                "SELECT function, minute / 60, SUM(count) FROM minutes WHERE minute < ? "
                "GROUP BY function, minute / 60 "
                "ON CONFLICT(function, hour) DO UPDATE SET count = count + excluded.count",
                (cutoff,),
            )
            self._db.execute("DELETE FROM minutes WHERE minute < ?", (cutoff,))
            self._db.execute("DELETE FROM seen WHERE at < ?", (now - self._dedup_window_s,))

    def keep_answer_losses(self, judged: Judged) -> None:
        """Replace the kept answer losses (`phase.Scores`) with `judged`, in one transaction."""
        with self._db:
            self._db.execute("DELETE FROM answer_losses")
            self._db.executemany(
                "INSERT INTO answer_losses(function, idle, phase, minute) VALUES (?, ?, ?, ?)",
                [(name, idle, by_phase, judged.minute) for name, (idle, by_phase) in judged.losses.items()],
            )

    def answer_losses(self) -> Judged | None:
        """The answer losses last kept; None when none were."""
        rows = self._db.execute("SELECT function, idle, phase, minute FROM answer_losses").fetchall()
        if not rows:
            return None
        losses = {name: (idle, by_phase) for name, idle, by_phase, _ in rows}
        return Judged(max(row[3] for row in rows), losses)

    def close(self) -> None:
        self._db.close()


def _connect(location: str) -> sqlite3.Connection:
    db = sqlite3.connect(location, isolation_level="DEFERRED", check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")  # an acknowledged event survives power loss too
    db.executescript(
        """
        CREATE TABLE IF NOT EXISTS minutes (function TEXT NOT NULL, minute INTEGER NOT NULL,
            count INTEGER NOT NULL, PRIMARY KEY (function, minute)) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS hours (function TEXT NOT NULL, hour INTEGER NOT NULL,
            count INTEGER NOT NULL, PRIMARY KEY (function, hour)) WITHOUT ROWID;
        CREATE TABLE IF NOT EXISTS seen (source TEXT NOT NULL, id TEXT NOT NULL, at REAL NOT NULL,
            PRIMARY KEY (source, id)) WITHOUT ROWID;
        CREATE INDEX IF NOT EXISTS seen_at ON seen(at);
        CREATE TABLE IF NOT EXISTS pods (uid TEXT PRIMARY KEY, function TEXT NOT NULL,
            revision TEXT NOT NULL, created REAL NOT NULL, ready REAL, deleted REAL);
        CREATE TABLE IF NOT EXISTS routes (function TEXT PRIMARY KEY, revision TEXT);
        CREATE TABLE IF NOT EXISTS answer_losses (function TEXT PRIMARY KEY, idle REAL NOT NULL,
            phase REAL NOT NULL, minute INTEGER NOT NULL);
        """
    )
    db.execute("SELECT count(*) FROM minutes").fetchone()  # a corrupt file fails here, not later
    return db


def rebuild(store: HistoryStore, counts: MinuteCounts, *, now_minute: int) -> int:
    """Load the store's last two days into `counts`, least recently invoked function first (so
    that, over the cap, the most recent ones are held); returns the rows read."""
    since = now_minute - MINUTES_KEPT + 1
    functions = store.recency(since)
    if counts.capacity is not None:
        functions = functions[-counts.capacity :]  # the most recent ones
    rows = 0
    for function in functions:
        series = store.series(function, since)
        counts.load(function, series[:, 0], series[:, 1])
        rows += len(series)
    return rows


def idle_minutes(series: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """Idle periods between invocation minutes of one series (minutes), as the policy sees them."""
    minutes = np.flatnonzero(series)
    return np.diff(minutes).astype(np.float64)
