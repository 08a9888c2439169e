"""Revision min-scale patches: apply, expire, restore exactly, and let humans win."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from prewarm import actuation as act

NOW = datetime(2026, 12, 2, 18, 0, tzinfo=UTC)
UNTIL = NOW + timedelta(minutes=10)


def merged(annotations: dict[str, str], change: act.Change) -> dict[str, str]:
    """Apply a JSON merge patch the way the API server does (None deletes)."""
    assert change.patch is not None
    result = dict(annotations)
    for key, value in change.patch["metadata"]["annotations"].items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = value
    return result


@pytest.mark.parametrize("author", [{}, {act.MIN_SCALE: "1"}, {act.MIN_SCALE: "0"}])
def test_warm_then_restore_gives_back_exactly_what_the_author_had(author: dict[str, Any]) -> None:
    base = {"serving.knative.dev/service": "hello", **author}
    held = merged(base, act.warm(base, 3, UNTIL))
    assert held[act.MIN_SCALE] == "3" and held[act.APPLIED] == "3"
    assert held[act.UNTIL] == "2026-12-02T18:10:00Z"
    assert merged(held, act.restore(held)) == base


def test_never_below_the_authors_min_scale() -> None:
    base = {act.MIN_SCALE: "4"}
    assert act.warm(base, 2, UNTIL).patch is None  # the author's 4 already covers 2
    held = merged(base, act.warm(base, 6, UNTIL))
    lowered = merged(held, act.warm(held, 1, UNTIL))  # a later, smaller plan
    assert lowered[act.MIN_SCALE] == "4" and lowered[act.ORIGINAL] == "4"
    assert act.author_min_scale(lowered) == 4


def test_extending_a_window_keeps_the_original() -> None:
    held = merged({act.MIN_SCALE: "1"}, act.warm({act.MIN_SCALE: "1"}, 2, UNTIL))
    later = merged(held, act.warm(held, 2, UNTIL + timedelta(minutes=5)))
    assert later[act.ORIGINAL] == "1" and later[act.UNTIL] == "2026-12-02T18:15:00Z"
    assert act.warm(later, 2, UNTIL + timedelta(minutes=5)).patch is None  # idempotent


def test_a_human_edit_wins_until_the_value_is_ours_again() -> None:
    held = merged({}, act.warm({}, 2, UNTIL))
    edited = {**held, act.MIN_SCALE: "5"}
    assert act.warm(edited, 3, UNTIL).patch is None
    assert act.restore(edited).patch is None
    back = {**edited, act.MIN_SCALE: "2"}  # the human set it back to what we applied
    assert merged(back, act.restore(back)) == {}


def test_restore_of_an_untouched_revision_does_nothing() -> None:
    assert act.restore({act.MIN_SCALE: "2"}).patch is None


def test_expiry() -> None:
    held = merged({}, act.warm({}, 1, UNTIL))
    assert not act.expired(held, NOW)
    assert act.expired(held, UNTIL)
    assert act.expired({**held, act.UNTIL: "garbage"}, NOW)  # unreadable: restore
    assert not act.expired({act.MIN_SCALE: "1"}, UNTIL)  # not ours


def test_absurd_author_values_count_as_zero() -> None:
    assert act.author_min_scale({act.MIN_SCALE: "-3"}) == 0
    assert act.author_min_scale({act.MIN_SCALE: "lots"}) == 0
