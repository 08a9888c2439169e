"""ApiServerSource events (`mode: Resource`) about Knative pods and revisions, as history.

Pods labelled with a Knative Service: creation, binding (PodScheduled), readiness (the Ready
condition turning true) and deletion, i.e. scale events, and the observed cold start, creation
to Ready (with its parts: to bound, then to Ready). Revisions:
the one labelled `serving.knative.dev/routingState: active` is the function's routed revision.
Event types and attributes: protocols.md §4.2; the data is the whole object.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from forecaster.history import Effect, PodChange, Route
from plugin import convert
from plugin.errors import BadRequest

PREFIX = "dev.knative.apiserver.resource."
ROUTING_STATE = "serving.knative.dev/routingState"
MAX_UID_LENGTH = 128  # a uid is a UUID (36); what the history keys pods by


def effect(event_type: str, obj: Any, *, now: float) -> Effect:
    """What an ApiServerSource event changes; an empty `Effect` for objects that are not ours."""
    if not isinstance(obj, Mapping):
        raise BadRequest(f"{event_type}: data must be the resource object")
    meta = _mapping(obj, "metadata", event_type)
    labels = _mapping(meta, "labels", f"{event_type}: metadata")
    namespace = meta.get("namespace") or "default"
    if not isinstance(namespace, str):
        raise BadRequest(f"{event_type}: metadata.namespace must be a string")
    function = convert.function_of(namespace, labels)
    if function is None:
        return Effect()
    if not convert.FUNCTION.fullmatch(function):
        raise BadRequest(f"{event_type}: {function!r:.200} is not namespace/service (Kubernetes names)")
    deleted = event_type.endswith(".delete")
    if obj.get("kind") == "Pod":
        return Effect(pods=[_pod_change(obj, meta, labels, function, deleted=deleted, now=now)])
    if obj.get("kind") == "Revision":
        if labels.get(ROUTING_STATE) == "active" and not deleted:
            return Effect(routes=[Route(function, _name(meta.get("name"), "revision: metadata.name"))])
        return Effect()
    return Effect()


def _pod_change(
    obj: Mapping[str, Any],
    meta: Mapping[str, Any],
    labels: Mapping[str, str],
    function: str,
    *,
    deleted: bool,
    now: float,
) -> PodChange:
    created = _time(meta.get("creationTimestamp"), "metadata.creationTimestamp") or now
    since: dict[str, float | None] = {"Ready": None, "PodScheduled": None}
    conditions = _mapping(obj, "status", "pod").get("conditions") or []
    if not isinstance(conditions, list):
        raise BadRequest("pod: status.conditions must be a list")
    for condition in conditions:
        kind = condition.get("type") if isinstance(condition, Mapping) else None
        if isinstance(kind, str) and kind in since and condition.get("status") == "True":
            since[kind] = _time(
                condition.get("lastTransitionTime"), f"status.conditions[{kind}].lastTransitionTime"
            )
    gone = _time(meta.get("deletionTimestamp"), "metadata.deletionTimestamp")
    uid = (
        meta.get("uid")
        or f"{function.partition('/')[0]}/{_name(meta.get('name'), 'pod: name', convert.SUBDOMAIN)}"
    )
    # printable also rules out lone surrogates, which SQLite cannot store
    if not isinstance(uid, str) or len(uid) > MAX_UID_LENGTH or not uid.isprintable():
        raise BadRequest(f"pod: metadata.uid {uid!r:.100} is not an object uid")
    revision = labels.get(convert.REVISION_LABEL)
    return PodChange(
        uid=uid,
        function=function,
        revision="" if revision is None else _name(revision, f"pod: labels[{convert.REVISION_LABEL}]"),
        created=created,
        ready=since["Ready"],
        deleted=(gone or now) if deleted else None,
        scheduled=since["PodScheduled"],
    )


def _name(raw: object, where: str, pattern: re.Pattern[str] = convert.NAME) -> str:
    """A Kubernetes name: a DNS-1123 label (at most 63 characters), or a subdomain for pods."""
    if not isinstance(raw, str) or len(raw) > 253 or not pattern.fullmatch(raw):
        raise BadRequest(f"{where}: {raw!r:.100} is not a Kubernetes name")
    return raw


def _time(raw: object, where: str) -> float | None:
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise BadRequest(f"{where}: expected an RFC 3339 timestamp")
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError as error:
        raise BadRequest(f"{where}: {raw!r} is not an RFC 3339 timestamp") from error


def _mapping(obj: Mapping[str, Any], key: str, where: str) -> Mapping[str, Any]:
    """`obj[key]` when it is an object (empty when absent); BadRequest naming it otherwise."""
    value = obj.get(key) or {}
    if not isinstance(value, Mapping):
        raise BadRequest(f"{where}: {key} must be an object")
    return value
