"""Invocation history: the minute ring, the SQLite store, dedup, compaction, corruption."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from forecaster.history import (
    MINUTES_KEPT,
    ColdStart,
    Count,
    Effect,
    HistoryStore,
    Lifecycle,
    MinuteCounts,
    PodChange,
    idle_minutes,
    rebuild,
)
from forecaster.phase import Judged


def test_ring_keeps_two_days_and_adds_up() -> None:
    counts = MinuteCounts()
    counts.add("ns/a", 100, 2)
    counts.add("ns/a", 100, 3)
    counts.add("ns/a", 103, 1)
    counts.add("ns/b", 101, 70_000)  # beyond uint16: kept exactly
    assert list(counts.series("ns/a", 104, 5)) == [0, 5, 0, 0, 1]
    assert counts.series("ns/b", 102, 1)[0] == 70_000
    counts.add("ns/a", 100 + MINUTES_KEPT, 4)  # two days later, minute 100 has left the ring
    series = counts.series("ns/a", 101 + MINUTES_KEPT, MINUTES_KEPT + 1)
    assert series[0] == 0 and series[-1] == 4 and series.sum() == 5  # 103's 1 is still in
    assert list(counts.series("ns/unknown", 10, 3)) == [0, 0, 0]
    assert counts.functions == ["ns/a", "ns/b"]


def test_ring_size_fits_the_memory_budget() -> None:
    counts = MinuteCounts()
    for i in range(10_000):
        counts.add(f"ns/f{i}", 5, 1)
    assert counts.nbytes == 10 * 1024 * MINUTES_KEPT * 2  # ten blocks of 1,024 rows: 59 MB


def test_at_capacity_the_least_recently_counted_function_gives_its_row_and_nothing_leaks() -> None:
    counts = MinuteCounts(capacity=3)
    counts.add("ns/a", 100, 70_000)  # in the overflow map, which must not reach the row's next owner
    counts.add("ns/b", 100, 1)
    counts.add("ns/c", 100, 1)
    counts.add("ns/a", 101, 1)  # a is recent again: b is now the least recently counted
    counts.add("ns/d", 102, 5)
    assert sorted(counts.functions) == ["ns/a", "ns/c", "ns/d"] and counts.evicted == 1
    assert counts.series("ns/b", 103, 3).sum() == 0
    assert list(counts.series("ns/d", 103, 4)) == [0, 0, 0, 5]  # b's minute 100 is not in d's row
    counts.add("ns/e", 103, 1)  # evicts c, then a (the overflow's row) for f
    counts.add("ns/f", 103, 1)
    assert sorted(counts.functions) == ["ns/d", "ns/e", "ns/f"] and counts.evicted == 3
    assert list(counts.series("ns/f", 104, 5)) == [0, 0, 0, 0, 1]
    assert counts.nbytes == MinuteCounts.BLOCK_ROWS * MINUTES_KEPT * 2  # rows reused, never grown


def test_a_flood_of_made_up_names_evicts_only_made_up_names() -> None:
    services = {f"ns/svc-{i}" for i in range(50)}
    counts = MinuteCounts(capacity=100, keep=services.__contains__)
    for i in range(50):
        counts.add(f"ns/svc-{i}", 1000, i + 1)
    for i in range(10_000):
        counts.add(f"flood/f{i}", 1001 + i // 100, 1)
    assert len(counts) == 100 and counts.evicted == 10_000 - 50 and counts.refused == 0
    assert services <= set(counts.functions)
    assert counts.series("ns/svc-7", 1001, 1)[0] == 8  # the services' history intact
    full = MinuteCounts(capacity=2, keep=lambda _: True)  # every held function protected
    full.add("ns/a", 1, 1)
    full.add("ns/b", 1, 1)
    full.add("ns/c", 1, 1)
    assert full.functions == ["ns/a", "ns/b"] and full.refused == 1 and full.evicted == 0


def test_a_capped_rebuild_holds_the_most_recent_functions(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db")
    store.record([(None, Effect(counts=[Count(f"ns/f{i}", 10 + i, 1) for i in range(5)]))], now=0.0)
    counts = MinuteCounts(capacity=3)
    assert rebuild(store, counts, now_minute=20) == 3  # only the rows memory keeps are read
    assert sorted(counts.functions) == ["ns/f2", "ns/f3", "ns/f4"]
    assert sum(len(store.series(f, 0)) for f in store.recency(0)) == 5  # the database forgets nothing


def test_a_rebuild_holds_what_adding_every_row_would(tmp_path: Path) -> None:
    """`rebuild` loads each function's rows at once: the same series, overflow included, as
    adding the rows one by one, and the same least recently invoked function evicted next."""
    rng = np.random.default_rng(3)
    now = 10 * MINUTES_KEPT
    rows = [
        Count(f"ns/f{f}", int(minute), int(rng.choice([1, 7, 70_000])))
        for f in range(30)
        for minute in rng.choice(
            np.arange(now - 2 * MINUTES_KEPT, now), size=int(rng.integers(1, 300)), replace=False
        )
    ]
    store = HistoryStore(tmp_path / "h.db")
    store.record([(None, Effect(counts=rows))], now=0.0)
    rebuilt, added = MinuteCounts(capacity=30), MinuteCounts(capacity=30)
    rebuild(store, rebuilt, now_minute=now)
    for row in sorted(rows, key=lambda r: r.minute):
        if row.minute > now - MINUTES_KEPT:
            added.add(row.function, row.minute, row.count)
    assert sorted(rebuilt.functions) == sorted(added.functions)
    for function in added.functions:
        assert np.array_equal(
            rebuilt.series(function, now + 1, MINUTES_KEPT), added.series(function, now + 1, MINUTES_KEPT)
        )
    rebuilt.add("ns/new", now, 1)
    added.add("ns/new", now, 1)
    assert sorted(rebuilt.functions) == sorted(added.functions)  # the same one evicted


def test_the_lifecycle_is_bounded_like_the_counts() -> None:
    """Events can name any pod of any function: pods and observed cold starts are capped."""
    pods = Lifecycle(max_pods=3, max_functions=2)
    for i in range(5):
        pods.apply(Effect(pods=[PodChange(f"u{i}", f"ns/f{i}", "r", created=10.0 * i, ready=10.0 * i + 2)]))
    assert list(pods.pods) == ["u2", "u3", "u4"]  # the oldest tracked pods let go
    assert list(pods.cold_starts_s) == ["ns/f3", "ns/f4"] and pods.cold_starts_s["ns/f4"] == [2.0]


def test_idle_minutes() -> None:
    assert list(idle_minutes(np.array([0, 1, 0, 0, 2, 1]))) == [3.0, 1.0]


def test_store_commits_dedups_and_rebuilds(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    store = HistoryStore(path)
    fresh = store.record(
        [
            (("src", "1"), Effect(counts=[Count("ns/a", 10, 2)])),
            (("src", "1"), Effect(counts=[Count("ns/a", 10, 2)])),
            (None, Effect(counts=[Count("ns/b", 11, 1)])),
        ],
        now=1000.0,
    )
    assert fresh == [True, False, True]
    store.close()
    again = HistoryStore(path)  # a restart: the same data, and the same dedup memory
    assert again.record([(("src", "1"), Effect(counts=[Count("ns/a", 10, 9)]))], 1001.0) == [False]
    counts = MinuteCounts()
    assert rebuild(again, counts, now_minute=20) == 2
    assert counts.series("ns/a", 11, 1)[0] == 2


def test_compaction_rolls_old_minutes_into_hours_and_forgets_old_keys(tmp_path: Path) -> None:
    store = HistoryStore(tmp_path / "h.db", dedup_window_s=60)
    store.record(
        [(("s", "old"), Effect(counts=[Count("ns/a", 60, 1), Count("ns/a", 61, 2), Count("ns/a", 5000, 3)]))],
        now=0.0,
    )
    store.compact(now_minute=5000, now=100.0)
    assert store.hours("ns/a") == [(1, 3)]
    assert store.recency(0) == ["ns/a"] and store.series("ns/a", 0)[:, 0].tolist() == [5000]
    again = store.record([(("s", "old"), Effect(counts=[Count("ns/a", 5000, 1)]))], 101.0)
    assert again == [True]  # the key has expired


def test_a_corrupt_database_is_moved_aside(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "history.db"
    path.write_bytes(b"this is not a database" * 100)
    with caplog.at_level(logging.ERROR):
        store = HistoryStore(path)
    assert "unreadable" in caplog.text
    assert list(tmp_path.glob("history.db.corrupt-*"))
    assert store.record([(None, Effect(counts=[Count("ns/a", 1, 1)]))], 0.0) == [True]


def test_answer_losses_survive_a_restart_and_each_keep_replaces_the_last(tmp_path: Path) -> None:
    path = tmp_path / "history.db"
    store = HistoryStore(path)
    assert store.answer_losses() is None  # nothing kept yet
    store.keep_answer_losses(Judged(100, {"ns/a": (1.5, 0.25), "ns/b": (0.5, 0.75)}))
    store.keep_answer_losses(Judged(101, {"ns/a": (1.25, 0.5)}))  # ns/b is no longer forecast
    store.close()
    assert HistoryStore(path).answer_losses() == Judged(101, {"ns/a": (1.25, 0.5)})


def test_a_pod_going_ready_is_one_cold_start_with_its_parts() -> None:
    pods = Lifecycle()
    created = PodChange(uid="p1", function="shop/cart", revision="cart-1", created=100.0)
    assert pods.apply(Effect(pods=[created])) == []
    bound = PodChange(uid="p1", function="shop/cart", revision="cart-1", created=100.0, scheduled=101.5)
    assert pods.apply(Effect(pods=[bound])) == []
    ready = PodChange(uid="p1", function="shop/cart", revision="cart-1", created=100.0, ready=107.0)
    assert pods.apply(Effect(pods=[ready])) == [
        ColdStart("p1", "shop/cart", 7.0, scheduling_s=1.5, startup_s=5.5)
    ]
    assert pods.apply(Effect(pods=[ready])) == []  # observed once, redelivered or not
    unbound = PodChange(uid="p2", function="shop/cart", revision="cart-1", created=200.0, ready=203.0)
    assert pods.apply(Effect(pods=[unbound])) == [
        ColdStart("p2", "shop/cart", 3.0, scheduling_s=None, startup_s=None)
    ]
    assert pods.cold_starts_s["shop/cart"] == [7.0, 3.0]
