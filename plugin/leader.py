"""Leader election on a `coordination.k8s.io/v1` Lease: only the leader actuates.

The decision (`claim`) is pure and follows client-go's leaderelection: a replica holds the
lease while it renews it within `leaseDurationSeconds`; another takes over only after that
has passed without a renewal. Writes carry the lease's `resourceVersion`, so when two replicas
race, the API server lets one win (the other gets 409 and stays a follower). Every replica
keeps serving the extender either way. A leader that stops cleanly releases the lease as
client-go's ReleaseOnCancel does (no holder, a one-second duration), so a successor takes over
at its next try instead of waiting out the full duration.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.aio.client import ApiClient

from plugin import kube
from plugin.errors import KubeApiError
from prewarm import rfc3339

logger = logging.getLogger(__name__)
MICRO = "%Y-%m-%dT%H:%M:%S.%fZ"  # the MicroTime format of acquireTime and renewTime


@dataclass(frozen=True, slots=True)
class Claim:
    """What this replica should write (None: nothing, it follows) and whether it then leads."""

    spec: dict[str, Any] | None
    leads: bool


def claim(current: dict[str, Any] | None, me: str, now: datetime, duration_s: int) -> Claim:
    """The lease spec to write, given the lease as read (None when it does not exist)."""
    stamp = now.astimezone(UTC).strftime(MICRO)
    fresh = {
        "holderIdentity": me,
        "leaseDurationSeconds": duration_s,
        "acquireTime": stamp,
        "renewTime": stamp,
    }
    if current is None:
        return Claim({**fresh, "leaseTransitions": 0}, leads=True)
    holder = current.get("holderIdentity") or ""
    if holder == me:
        return Claim({**current, "renewTime": stamp, "leaseDurationSeconds": duration_s}, leads=True)
    renewed = rfc3339.parse(current.get("renewTime"))  # unreadable: as if never renewed
    held_for = timedelta(seconds=int(current.get("leaseDurationSeconds") or duration_s))
    if holder and renewed is not None and now < renewed + held_for:
        return Claim(None, leads=False)
    transitions = int(current.get("leaseTransitions") or 0) + 1
    return Claim({**fresh, "leaseTransitions": transitions}, leads=True)


class LeaderElector:
    """Keeps trying to hold the lease; `leading` says whether this replica may actuate."""

    def __init__(
        self,
        api: ApiClient,
        *,
        namespace: str,
        name: str,
        me: str,
        duration_s: int = 15,
        timeout_s: float = 5.0,
    ) -> None:
        self.api, self.namespace, self.name, self.me = api, namespace, name, me
        self.duration_s, self.timeout_s = duration_s, timeout_s
        self.leading = False

    async def step(self, now: datetime) -> bool:
        """One read-decide-write round; returns whether this replica leads afterwards."""
        try:
            lease = await kube.get_lease(
                self.api, namespace=self.namespace, name=self.name, timeout_s=self.timeout_s
            )
        except KubeApiError as error:
            if error.status != 404:
                return self._set(False, f"cannot read the lease: {error}")
            lease = None
        decision = claim(lease.get("spec") if lease else None, self.me, now, self.duration_s)
        if decision.spec is None:
            return self._set(False, "another replica holds the lease")
        try:
            await kube.write_lease(
                self.api,
                namespace=self.namespace,
                name=self.name,
                spec=decision.spec,
                resource_version=(lease or {}).get("metadata", {}).get("resourceVersion"),
                timeout_s=self.timeout_s,
            )
        except KubeApiError as error:
            return self._set(False, f"lost the lease race: {error}" if error.status == 409 else str(error))
        return self._set(True, "holding the lease")

    async def release(self) -> None:
        """Give the lease up if this replica holds it; best effort (it expires anyway)."""
        if not self.leading:
            return
        self.leading = False
        try:
            lease = await kube.get_lease(
                self.api, namespace=self.namespace, name=self.name, timeout_s=self.timeout_s
            )
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.me:
                return
            stamp = datetime.now(UTC).strftime(MICRO)
            released = {**spec, "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": stamp}
            await kube.write_lease(
                self.api,
                namespace=self.namespace,
                name=self.name,
                spec=released,
                resource_version=lease.get("metadata", {}).get("resourceVersion"),
                timeout_s=self.timeout_s,
            )
            logger.info("leader election: %s released the lease", self.me)
        except KubeApiError as error:
            logger.warning("leader election: could not release the lease (%s); it expires on its own", error)

    def _set(self, leading: bool, why: str) -> bool:
        if leading != self.leading:
            logger.info("leader election: %s %s (%s)", self.me, "leads" if leading else "follows", why)
        self.leading = leading
        return leading

    async def run(self) -> None:
        """Renew at a third of the lease duration, as client-go's defaults roughly do."""
        while True:
            await self.step(datetime.now(UTC))
            await asyncio.sleep(self.duration_s / 3)
