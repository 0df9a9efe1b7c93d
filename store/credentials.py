"""Credential limits (until when a credential is rate limited, and how many limits in a row) and the runs to
tell when one is: the record every run on a shared credential pauses and resumes by."""

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa

from store.base import StoreBase
from store.connection import as_utc, unavailable
from store.schema import credential_limits, credential_subscribers


class CredentialLimits(StoreBase):
    @unavailable
    async def record_credential_limit(self, credential: str, until: datetime) -> None:
        """One more limit on `credential` (a 429): limited until the latest `until` reported, a strike more."""
        now = self.clock()
        row = credential_limits.c
        upsert = self._insert(credential_limits).values(
            credential=credential, until=until, strikes=1, updated_at=now
        )
        async with self.engine.begin() as c:
            await c.execute(
                upsert.on_conflict_do_update(
                    index_elements=["credential"],
                    set_={
                        "until": sa.case((row.until < until, until), else_=row.until),
                        "strikes": row.strikes + 1,
                        "updated_at": now,
                    },
                )
            )

    @unavailable
    async def credential_limit(self, credential: str) -> tuple[datetime, int] | None:
        """(until, strikes) of the latest limit on `credential`, or None: never limited."""
        async with self.engine.connect() as c:
            row = (
                await c.execute(
                    sa.select(credential_limits.c.until, credential_limits.c.strikes).where(
                        credential_limits.c.credential == credential
                    )
                )
            ).first()
        return (as_utc(row.until), int(row.strikes)) if row else None

    @unavailable
    async def clear_credential_strikes(self, credential: str) -> None:
        """A call on `credential` succeeded: its strikes start over, unless it is limited again meanwhile."""
        now = self.clock()
        async with self.engine.begin() as c:
            await c.execute(
                sa.update(credential_limits)
                .where(credential_limits.c.credential == credential, credential_limits.c.until <= now)
                .values(strikes=0, updated_at=now)
            )

    @unavailable
    async def subscribe_to_credential(self, credential: str, workflow_id: str) -> None:
        """The run `workflow_id` is told of limits on `credential` from now on (again: nothing changes)."""
        row = self._insert(credential_subscribers).values(
            credential=credential, workflow_id=workflow_id, subscribed_at=self.clock()
        )
        async with self.engine.begin() as c:
            await c.execute(row.on_conflict_do_nothing(index_elements=["credential", "workflow_id"]))

    @unavailable
    async def unsubscribe_from_credential(self, credential: str, workflow_ids: Sequence[str]) -> int:
        """Forget these runs' subscriptions to `credential`; returns how many there were."""
        if not workflow_ids:
            return 0
        row = credential_subscribers.c
        async with self.engine.begin() as c:
            deleted = await c.execute(
                sa.delete(credential_subscribers).where(
                    row.credential == credential, row.workflow_id.in_(list(workflow_ids))
                )
            )
        return int(deleted.rowcount or 0)

    @unavailable
    async def credential_subscribers(
        self, credential: str, *, after: str = "", limit: int = 1000
    ) -> list[str]:
        """The workflow ids subscribed to `credential`, in order, the first `limit` past `after`."""
        row = credential_subscribers.c
        async with self.engine.connect() as c:
            result = await c.execute(
                sa.select(row.workflow_id)
                .where(row.credential == credential, row.workflow_id > after)
                .order_by(row.workflow_id)
                .limit(limit)
            )
            return [r.workflow_id for r in result]
