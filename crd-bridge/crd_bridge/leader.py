"""Leader election on a coordination.k8s.io Lease: two bridge replicas never both reconcile Runs.

The holder renews the Lease every `renew_seconds`; another replica takes it only once `lease_seconds` have
passed since the last renewal, or at once when the holder gave it up on stopping (`release`). A leader that cannot renew in time stops acting (the process exits and is
restarted), so two leaders never overlap for longer than the clock skew between nodes.
"""

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from kube import ApiError, Kube, Unreachable, path

log = logging.getLogger(__name__)


class LostLeadership(Exception):
    pass


def _micro(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


class LeaderElector:
    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        lease_seconds: int = 15,
        renew_seconds: float = 5.0,
        retry_seconds: float = 2.0,
    ) -> None:
        self.kube = kube
        self.url = path("coordination.k8s.io/v1", "leases", namespace, name)
        self.collection = path("coordination.k8s.io/v1", "leases", namespace)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self.retry_seconds = retry_seconds
        self.last_renewal: datetime | None = None

    async def acquire(self) -> None:
        """Wait until this replica holds the Lease."""
        while True:  # polling a Lease is how Kubernetes leader election works: there is nothing to wait on
            if await self._try():
                break
            await asyncio.sleep(self.retry_seconds)
        log.info("%s leads (lease %s/%s)", self.identity, self.namespace, self.name)

    async def keep(self) -> None:
        """Renew until leadership cannot be kept; then raise LostLeadership."""
        while True:
            await asyncio.sleep(self.renew_seconds)
            try:
                if await self._try():
                    continue
                raise LostLeadership(f"{self.identity}: another replica holds the lease")
            except (Unreachable, ApiError) as err:
                log.warning("renewing the lease: %s", err)
            assert self.last_renewal is not None
            if datetime.now(UTC) - self.last_renewal > timedelta(
                seconds=self.lease_seconds - self.renew_seconds
            ):
                raise LostLeadership(f"{self.identity}: could not renew the lease in time")

    async def release(self, within: float = 3.0) -> None:
        """Give the Lease up, as client-go's ReleaseOnCancel does: a replica stopping gracefully (a pod deleted,
        `helm upgrade`, a node drain) lets the standby take over at its next try, instead of leaving Runs
        without status writes until the Lease expires. Only a Lease this replica still holds; call it once this
        replica has stopped acting. A failure costs only that wait."""
        try:
            async with asyncio.timeout(within):
                lease = await self.kube.get(self.url)
                current = lease.get("spec", {})
                if current.get("holderIdentity") != self.identity:
                    return
                lease["spec"] = {
                    **current,
                    "holderIdentity": "",
                    "leaseDurationSeconds": 1,
                    "renewTime": _micro(datetime.now(UTC)),
                }
                await self.kube.replace(self.url, lease)
            log.info("%s gave the lease %s/%s up", self.identity, self.namespace, self.name)
        except (Unreachable, ApiError, TimeoutError) as err:
            log.warning("could not give the lease up (the standby takes it when it expires): %s", err)

    async def _try(self) -> bool:
        now = datetime.now(UTC)
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": self.lease_seconds,
            "renewTime": _micro(now),
        }
        try:
            lease = await self.kube.get(self.url)
        except ApiError as err:
            if err.status != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {**spec, "acquireTime": _micro(now), "leaseTransitions": 0},
            }
            try:
                await self.kube.create(self.collection, body)
            except ApiError as conflict:
                if conflict.status == 409:
                    return False
                raise
            self.last_renewal = now
            return True
        current = lease.get("spec", {})
        holder = current.get("holderIdentity")
        renewed = _parse(current.get("renewTime")) or datetime.min.replace(tzinfo=UTC)
        expired = now > renewed + timedelta(
            seconds=int(current.get("leaseDurationSeconds") or self.lease_seconds)
        )
        if holder not in (None, "", self.identity) and not expired:
            return False
        if holder != self.identity:
            spec["acquireTime"] = _micro(now)
            spec["leaseTransitions"] = int(current.get("leaseTransitions") or 0) + 1
        lease["spec"] = {**current, **spec}
        try:
            await self.kube.replace(self.url, lease)  # carries the resourceVersion it read: a race is a 409
        except ApiError as err:
            if err.status == 409:
                return False
            raise
        self.last_renewal = now
        return True
