"""RFC 3339 timestamps as Kubernetes writes them ("2026-12-02T18:10:00Z"), both ways."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def render(moment: datetime) -> str:
    """Seconds precision, UTC, `Z` suffix: what annotations and Event times use."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse(text: Any) -> datetime | None:
    """The moment, or None when `text` is absent or unreadable (callers choose the safe side)."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None  # RFC 3339 always carries an offset
