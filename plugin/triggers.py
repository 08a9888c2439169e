"""Knative Eventing Triggers: which Knative Services an event delivered by a Broker invokes.

An event that reaches the plugin through a Broker counts as one invocation of every Knative
Service whose Trigger on that Broker would deliver it. Filter semantics (knative/eventing
`pkg/broker/filter`, the CloudEvents Subscriptions API): `spec.filter.attributes` is an exact
match per attribute, an empty value matching any; `spec.filters`, when present, replaces it:
a list of expressions that must all hold, each one of `exact`, `prefix`, `suffix` (every
attribute given must be present and match), `all`, `any`, `not`. `cesql` is not supported:
it is logged once per Trigger and never matches. Only Triggers whose subscriber is a Knative
Service (`subscriber.ref`, kind Service, group serving.knative.dev) count.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from plugin.convert import object_key

logger = logging.getLogger(__name__)

Obj = Mapping[str, Any]
Attributes = Mapping[str, str]


@dataclass(frozen=True)
class Trigger:
    namespace: str
    name: str
    broker: str
    function: str  # "namespace/service" of the subscriber
    attributes: Mapping[str, str]  # spec.filter.attributes
    filters: tuple[Obj, ...] | None  # spec.filters (replaces `attributes` when present)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def matches(self, event: Attributes) -> bool:
        if self.filters is not None:
            return all(_holds(f, event, self.key) for f in self.filters)
        return all(value == "" or event.get(name) == value for name, value in self.attributes.items())


def from_object(obj: Obj) -> Trigger | None:
    """The Trigger, or None when it is malformed or its subscriber is not a Knative Service."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    namespace, name = meta.get("namespace") or "default", meta.get("name")
    ref = (spec.get("subscriber") or {}).get("ref") or {}
    if not isinstance(name, str) or not isinstance(ref, Mapping):
        return None
    if ref.get("kind") != "Service" or not str(ref.get("apiVersion", "")).startswith("serving.knative.dev/"):
        return None
    attributes = (spec.get("filter") or {}).get("attributes") or {}
    filters = spec.get("filters")
    if not isinstance(attributes, Mapping) or (filters is not None and not isinstance(filters, list)):
        logger.warning("trigger %s/%s has a malformed filter; ignoring it", namespace, name)
        return None
    return Trigger(
        namespace=namespace,
        name=name,
        broker=str(spec.get("broker") or "default"),
        function=f"{ref.get('namespace') or namespace}/{ref.get('name')}",
        attributes={str(k): str(v) for k, v in attributes.items()},
        filters=tuple(filters) if filters is not None else None,
    )


_warned_cesql: set[str] = set()


def _holds(expression: Obj, event: Attributes, trigger: str) -> bool:
    if not isinstance(expression, Mapping) or len(expression) != 1:
        return False
    ((dialect, argument),) = expression.items()
    if dialect in ("exact", "prefix", "suffix"):
        if not isinstance(argument, Mapping) or not argument:
            return False
        return all(
            name in event and _compare(dialect, event[name], str(value)) for name, value in argument.items()
        )
    if dialect in ("all", "any"):
        if not isinstance(argument, list):
            return False
        combine = all if dialect == "all" else any
        return combine(_holds(e, event, trigger) for e in argument)
    if dialect == "not":
        return not _holds(argument, event, trigger)
    if dialect == "cesql" and trigger not in _warned_cesql:
        _warned_cesql.add(trigger)
        logger.warning(
            "trigger %s uses a cesql filter, which kdrl does not evaluate: it never matches", trigger
        )
    return False


def _compare(dialect: str, actual: str, wanted: str) -> bool:
    if dialect == "prefix":
        return actual.startswith(wanted)
    if dialect == "suffix":
        return actual.endswith(wanted)
    return actual == wanted


@dataclass
class TriggerIndex:
    """The Triggers the plugin knows, kept current by a watch; answers `functions_for`."""

    triggers: dict[str, Trigger] = field(default_factory=dict)

    def replace(self, items: list[dict[str, Any]]) -> None:
        self.triggers = {t.key: t for t in map(from_object, items) if t is not None}

    def apply(self, type_: str, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        trigger = None if type_ == "DELETED" else from_object(obj)
        if trigger is None:
            self.triggers.pop(key, None)
        else:
            self.triggers[key] = trigger

    def live(self, live: bool) -> None:
        """The index keeps its last view while the API server is away."""

    def functions_for(self, event: Attributes, *, namespace: str | None, broker: str | None) -> list[str]:
        """Services invoked by `event` as delivered by `broker` in `namespace` (any when None)."""
        found = {
            t.function
            for t in self.triggers.values()
            if (namespace is None or t.namespace == namespace)
            and (broker is None or t.broker == broker)
            and t.matches(event)
        }
        return sorted(found)


def attributes_of(raw: Mapping[str, Any]) -> dict[str, str]:
    """An event's context attributes and extensions as strings, as filters compare them."""
    out = {}
    for name, value in raw.items():
        if value is None:
            continue
        out[name] = value.isoformat().replace("+00:00", "Z") if hasattr(value, "isoformat") else str(value)
    return out
