"""Lease-based leader election: the pure claim rules and two replicas racing on the fake API server."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from plugin.leader import LeaderElector, claim
from tests.conftest import api_client
from tests.fakekube import FakeKube

T0 = datetime(2026, 12, 2, 18, 0, tzinfo=UTC)


def test_claim_rules() -> None:
    first = claim(None, "a", T0, 15)
    assert first.leads and first.spec is not None and first.spec["holderIdentity"] == "a"
    assert not claim(first.spec, "b", T0 + timedelta(seconds=10), 15).leads  # still held
    renewed = claim(first.spec, "a", T0 + timedelta(seconds=10), 15)
    assert (
        renewed.leads
        and renewed.spec is not None
        and renewed.spec["acquireTime"] == first.spec["acquireTime"]
    )
    taken = claim(first.spec, "b", T0 + timedelta(seconds=16), 15)  # a stopped renewing
    assert taken.leads and taken.spec is not None and taken.spec["leaseTransitions"] == 1
    assert claim({"holderIdentity": "a", "renewTime": "not a time"}, "b", T0, 15).leads


async def test_two_replicas_one_leader_then_failover(fake_kube: tuple[FakeKube, str]) -> None:
    fake, url = fake_kube
    api_a, api_b = api_client(url), api_client(url)
    a = LeaderElector(api_a, namespace="kdrl-system", name="kdrl-prewarm", me="a", duration_s=15)
    b = LeaderElector(api_b, namespace="kdrl-system", name="kdrl-prewarm", me="b", duration_s=15)
    try:
        assert await a.step(T0) is True
        assert await b.step(T0 + timedelta(seconds=1)) is False
        assert await a.step(T0 + timedelta(seconds=5)) is True  # renews
        assert await b.step(T0 + timedelta(seconds=19)) is False  # renewed at 5: held until 20
        assert await b.step(T0 + timedelta(seconds=21)) is True  # a went silent
        assert await a.step(T0 + timedelta(seconds=22)) is False
        assert fake.objects["leases"]["kdrl-system/kdrl-prewarm"]["spec"]["holderIdentity"] == "b"
    finally:
        await api_a.close()
        await api_b.close()


async def test_racing_replicas_one_wins_and_an_outage_means_following(
    fake_kube: tuple[FakeKube, str],
) -> None:
    fake, url = fake_kube
    apis = [api_client(url) for _ in range(3)]
    electors = [
        LeaderElector(api, namespace="kdrl-system", name="kdrl-prewarm", me=name)
        for api, name in zip(apis, "abc")
    ]
    try:
        outcomes = await asyncio.gather(*(e.step(T0) for e in electors))
        assert sorted(outcomes) == [False, False, True]  # both others got 409 AlreadyExists
        winner = electors[outcomes.index(True)]
        assert fake.objects["leases"]["kdrl-system/kdrl-prewarm"]["spec"]["holderIdentity"] == winner.me
        fake.outage = True
        assert await winner.step(T0 + timedelta(seconds=5)) is False  # cannot renew: stop actuating
    finally:
        for api in apis:
            await api.close()


async def test_a_clean_stop_releases_the_lease_so_the_successor_need_not_wait(
    fake_kube: tuple[FakeKube, str],
) -> None:
    fake, url = fake_kube
    api_a, api_b = api_client(url), api_client(url)
    a = LeaderElector(api_a, namespace="kdrl-system", name="kdrl-prewarm", me="a", duration_s=15)
    b = LeaderElector(api_b, namespace="kdrl-system", name="kdrl-prewarm", me="b", duration_s=15)
    try:
        assert await a.step(datetime.now(UTC)) is True
        assert await b.step(datetime.now(UTC)) is False  # held for 15 s ...
        await a.release()
        assert not a.leading
        assert fake.objects["leases"]["kdrl-system/kdrl-prewarm"]["spec"]["holderIdentity"] == ""
        assert await b.step(datetime.now(UTC)) is True  # ... but released: taken at once
        await a.release()  # a follower has nothing to give up
        assert fake.objects["leases"]["kdrl-system/kdrl-prewarm"]["spec"]["holderIdentity"] == "b"
    finally:
        await api_a.close()
        await api_b.close()
