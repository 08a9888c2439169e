"""Trigger filter semantics, table-driven, and broker-delivered events counted through a watch."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from cloudevents.core.bindings.http import to_binary_event
from cloudevents.core.v1.event import CloudEvent

from plugin import keys
from plugin.triggers import TriggerIndex, from_object
from tests.fakekube import FakeKube
from tests.test_cluster_cache import eventually, watching_client

EVENT = {
    "type": "com.shop.order.created",
    "source": "/shop/orders",
    "subject": "order-42",
    "region": "eu-west",
}


def trigger(
    name: str = "t",
    *,
    attributes: dict[str, str] | None = None,
    filters: list[Any] | None = None,
    service: str = "cart",
    broker: str = "default",
    namespace: str = "shop",
    kind: str = "Service",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "broker": broker,
        "subscriber": {"ref": {"apiVersion": "serving.knative.dev/v1", "kind": kind, "name": service}},
    }
    if attributes is not None:
        spec["filter"] = {"attributes": attributes}
    if filters is not None:
        spec["filters"] = filters
    return {
        "apiVersion": "eventing.knative.dev/v1",
        "kind": "Trigger",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


CASES = [
    ("no filter matches all", {}, None, True),
    ("exact attribute", {"type": "com.shop.order.created"}, None, True),
    ("wrong attribute", {"type": "com.shop.order.paid"}, None, False),
    ("empty value matches any", {"type": "", "source": "/shop/orders"}, None, True),
    ("extension attribute", {"region": "eu-west"}, None, True),
    ("missing attribute", {"tenant": "a"}, None, False),
    ("filters replace filter", {"type": "nope"}, [{"exact": {"type": "com.shop.order.created"}}], True),
    ("prefix", None, [{"prefix": {"type": "com.shop."}}], True),
    ("suffix", None, [{"suffix": {"source": "/orders"}}], True),
    ("prefix on missing attribute", None, [{"prefix": {"tenant": ""}}], False),
    ("all", None, [{"all": [{"prefix": {"type": "com."}}, {"exact": {"subject": "order-42"}}]}], True),
    ("all fails", None, [{"all": [{"prefix": {"type": "com."}}, {"exact": {"subject": "order-7"}}]}], False),
    ("any", None, [{"any": [{"exact": {"type": "x"}}, {"suffix": {"type": ".created"}}]}], True),
    ("not", None, [{"not": {"exact": {"type": "com.shop.order.created"}}}], False),
    ("list is anded", None, [{"prefix": {"type": "com."}}, {"exact": {"region": "us"}}], False),
    ("cesql never matches", None, [{"cesql": "type = 'com.shop.order.created'"}], False),
    ("malformed expression", None, [{"exact": {}, "prefix": {}}], False),
]


@pytest.mark.parametrize(("case", "attributes", "filters", "expected"), CASES, ids=[c[0] for c in CASES])
def test_filter_semantics(
    case: str, attributes: dict[str, str] | None, filters: list[Any] | None, expected: bool
) -> None:
    parsed = from_object(trigger(attributes=attributes, filters=filters))
    assert parsed is not None
    assert parsed.matches(EVENT) is expected


def test_cesql_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    parsed = from_object(trigger("sql", filters=[{"cesql": "true"}]))
    assert parsed is not None
    with caplog.at_level(logging.WARNING):
        parsed.matches(EVENT)
        parsed.matches(EVENT)
    assert caplog.text.count("cesql") == 1


def test_only_knative_service_subscribers_count() -> None:
    assert from_object(trigger(kind="Channel")) is None
    assert from_object({"metadata": {"name": "x"}, "spec": {"subscriber": {"uri": "http://x"}}}) is None


def test_index_answers_per_broker_and_follows_events() -> None:
    index = TriggerIndex()
    index.replace([trigger("a", service="cart"), trigger("b", service="pay", broker="other")])
    assert index.functions_for(EVENT, namespace="shop", broker="default") == ["shop/cart"]
    assert index.functions_for(EVENT, namespace=None, broker=None) == ["shop/cart", "shop/pay"]
    index.apply("DELETED", trigger("a"))
    assert index.functions_for(EVENT, namespace=None, broker=None) == ["shop/pay"]


async def test_broker_delivered_events_count_for_watched_triggers(
    aiohttp_client: Any, fake_kube: tuple[FakeKube, str]
) -> None:
    fake, url = fake_kube
    await fake.add(
        "triggers", trigger("orders", attributes={"type": "com.shop.order.created"}, service="cart")
    )
    client = await watching_client(aiohttp_client, url)
    sink = client.app[keys.EVENTS]
    await eventually(lambda: asyncio.sleep(0, bool(sink.triggers.triggers)))
    await fake.add(
        "triggers", trigger("all-orders", filters=[{"prefix": {"type": "com.shop."}}], service="audit")
    )
    await eventually(lambda: asyncio.sleep(0, len(sink.triggers.triggers) == 2))

    message = to_binary_event(CloudEvent(attributes={**EVENT, "id": "o-1"}, data={"order": 42}))
    response = await client.post(
        "/events?namespace=shop&broker=default", data=message.body, headers=message.headers
    )
    assert response.status == 202
    assert set(sink.counts.functions) == {"shop/cart", "shop/audit"}
    other = to_binary_event(CloudEvent(attributes={**EVENT, "id": "o-2", "type": "com.other"}, data=None))
    assert (await client.post("/events", data=other.body, headers=other.headers)).status == 202
    assert sink.unknown_types["com.other"] == 1
