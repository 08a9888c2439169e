"""Warm replicas as merge patches of a Revision's annotations: apply, expire, restore (pure).

The plugin raises `autoscaling.knative.dev/min-scale` on a function's routed Revision (Knative
Serving >= 1.21 syncs it to the PodAutoscaler in place; patching the Service template would roll
out a new revision). Everything it needs to undo the change lives on the Revision itself:

- `kdrl.dev/original-min-scale`: the author's own value ("" when there was none),
- `kdrl.dev/applied-min-scale`: the value the plugin wrote,
- `kdrl.dev/prewarm-until`: when the window ends (RFC 3339, UTC).

So `kdrl cleanup` can restore every revision after the plugin's own state is gone. When a
human edits `min-scale` meanwhile (it no longer equals the applied value), the human wins: the
plugin leaves that revision alone until the value is its own again. The plugin never goes
below the author's `min-scale`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from prewarm import rfc3339

MIN_SCALE = "autoscaling.knative.dev/min-scale"
ORIGINAL = "kdrl.dev/original-min-scale"
APPLIED = "kdrl.dev/applied-min-scale"
UNTIL = "kdrl.dev/prewarm-until"
OURS = (ORIGINAL, APPLIED, UNTIL)
# A held window is renewed only when less than this is left: a few planning cycles of margin,
# instead of a patch (and a Revision write) every minute per warm function.
RENEW_WITHIN = timedelta(minutes=3)

Patch = dict[str, dict[str, dict[str, str | None]]]  # {"metadata": {"annotations": {...}}}


@dataclass(frozen=True, slots=True)
class Change:
    """What to send (None: nothing) and why, for logs, spans and the shadow mode."""

    patch: Patch | None
    reason: str
    renewal: bool = False  # only the window moves: no Event for it (one Event per real change)


def author_min_scale(annotations: Mapping[str, str]) -> int:
    """The author's own min-scale: the recorded original while the plugin holds the revision."""
    text = annotations.get(ORIGINAL) if APPLIED in annotations else annotations.get(MIN_SCALE)
    return _int(text)


def warm(
    annotations: Mapping[str, str], replicas: int, until: datetime, *, now: datetime | None = None
) -> Change:
    """Hold at least `replicas` warm until `until` (never below the author's value). With `now`,
    a window already held at that size is renewed only once less than `RENEW_WITHIN` is left."""
    if _human_edited(annotations):
        return Change(None, "min-scale edited by someone else since the plugin set it: leaving it")
    target = max(replicas, author_min_scale(annotations))
    current = _int(annotations.get(MIN_SCALE))
    if APPLIED not in annotations and target <= current:
        return Change(None, f"the author's min-scale {current} already covers {replicas}")
    held_until = rfc3339.parse(annotations.get(UNTIL) or "")
    same_size = annotations.get(APPLIED) == str(target)
    if same_size and now is not None and held_until is not None and held_until - now > RENEW_WITHIN:
        return Change(None, f"warm until {annotations[UNTIL]} already")
    changes: dict[str, str | None] = {
        MIN_SCALE: str(target),
        APPLIED: str(target),
        UNTIL: rfc3339.render(until),
    }
    if APPLIED not in annotations:
        changes[ORIGINAL] = annotations.get(MIN_SCALE, "")
    if all(annotations.get(key) == value for key, value in changes.items()):
        return Change(None, "already warm as planned")
    if same_size:
        return Change(_patch(changes), f"window renewed until {changes[UNTIL]}", renewal=True)
    return Change(_patch(changes), f"min-scale {target} until {changes[UNTIL]}")


def restore(annotations: Mapping[str, str]) -> Change:
    """Give the revision back its author's value and drop the plugin's annotations."""
    if APPLIED not in annotations:
        return Change(None, "not held by the plugin")
    if _human_edited(annotations):
        return Change(None, "min-scale edited by someone else since the plugin set it: leaving it")
    original = annotations.get(ORIGINAL, "")
    changes: dict[str, str | None] = dict.fromkeys(OURS)
    changes[MIN_SCALE] = original or None  # None deletes the key in a JSON merge patch
    return Change(_patch(changes), f"min-scale restored to {original or 'unset'}")


def expired(annotations: Mapping[str, str], now: datetime) -> bool:
    """Whether the plugin holds this revision past its window (a restart missed the end)."""
    until = annotations.get(UNTIL)
    if APPLIED not in annotations or until is None:
        return False
    ends = rfc3339.parse(until)
    return ends is None or ends <= now  # an unreadable expiry is over: restoring is the safe side


def _human_edited(annotations: Mapping[str, str]) -> bool:
    return APPLIED in annotations and annotations.get(MIN_SCALE) != annotations[APPLIED]


def _patch(changes: dict[str, str | None]) -> Patch:
    return {"metadata": {"annotations": changes}}


def _int(text: str | None) -> int:
    try:
        return max(int(text or "0"), 0)
    except ValueError:
        return 0
