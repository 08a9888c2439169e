"""Kubernetes objects from JSON files, as `kubectl get ... -o json` writes them (offline mode)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from plugin.errors import SettingsError


def load(path: Path) -> list[dict[str, Any]]:
    """The objects in `path`: a List (`items`), a bare JSON array, or a single object."""
    try:
        document = json.loads(path.read_text())
    except OSError as error:
        raise SettingsError(f"{path}: cannot read: {error.strerror}") from error
    except ValueError as error:
        raise SettingsError(f"{path}: not valid JSON: {error}") from error
    items: list[Any]
    if isinstance(document, dict) and isinstance(document.get("items"), list):
        items = document["items"]
    elif isinstance(document, list):
        items = document
    elif isinstance(document, dict) and "metadata" in document:
        items = [document]
    else:
        raise SettingsError(f"{path}: expected a Kubernetes List, an array of objects or one object")
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("metadata"), dict):
            raise SettingsError(f"{path}: item {i} is not a Kubernetes object (no metadata)")
    return items


def load_one(path: Path) -> dict[str, Any]:
    items = load(path)
    if len(items) != 1:
        raise SettingsError(f"{path}: expected exactly one object, found {len(items)}")
    return items[0]
