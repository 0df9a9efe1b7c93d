"""Model usage: one row per model call of a run's attempt (a report seen again is the same row), summed per
attempt, per run, or per credential, namespace, person or model over a window."""

from datetime import datetime

import sqlalchemy as sa

from store.base import StoreBase
from store.connection import unavailable
from store.records import ModelCall, UsageTotal
from store.schema import model_usage

USAGE_GROUPS = ("credential", "namespace", "triggered_by", "model")


class ModelUsage(StoreBase):
    @unavailable
    async def record_usage(self, call: ModelCall) -> bool:
        """Record a call's usage; False when this call of this attempt was recorded already (not counted twice).
        Not fenced: a fenced-off attempt's call was still made, and paid for."""
        statement = (
            self._insert(model_usage)
            .values(**call.__dict__, at=self.clock())
            .on_conflict_do_nothing(index_elements=["run_uid", "attempt", "call_id"])
        )
        async with self.engine.begin() as c:
            return bool((await c.execute(statement.returning(model_usage.c.id))).first())

    @unavailable
    async def run_usage(self, run_uid: str, attempt: int | None = None) -> UsageTotal:
        """A run's calls and tokens (one attempt's, if given)."""
        query = sa.select(*_sums()).where(model_usage.c.run_uid == run_uid)
        if attempt is not None:
            query = query.where(model_usage.c.attempt == attempt)
        async with self.engine.connect() as c:
            row = (await c.execute(query)).one()
        return UsageTotal(run_uid, int(row.calls), int(row.input_tokens or 0), int(row.output_tokens or 0))

    @unavailable
    async def usage(
        self, by: str, since: datetime, until: datetime | None = None, namespace: str | None = None
    ) -> list[UsageTotal]:
        """Calls and tokens from `since` (to `until`) summed by `by` (one of USAGE_GROUPS), in one namespace or
        all, the largest first."""
        if by not in USAGE_GROUPS:
            raise ValueError(f"usage is summed by one of {', '.join(USAGE_GROUPS)}, not {by!r}")
        column = model_usage.c[by]
        query = sa.select(column.label("key"), *_sums()).where(model_usage.c.at >= since)
        if until is not None:
            query = query.where(model_usage.c.at < until)
        if namespace is not None:
            query = query.where(model_usage.c.namespace == namespace)
        query = query.group_by(column).order_by(sa.desc("input_tokens"), column)
        async with self.engine.connect() as c:
            rows = await c.execute(query)
            return [
                UsageTotal(str(r.key), int(r.calls), int(r.input_tokens or 0), int(r.output_tokens or 0))
                for r in rows
            ]


def _sums() -> list[sa.ColumnElement[int]]:
    return [
        sa.func.count().label("calls"),
        sa.func.sum(model_usage.c.input_tokens).label("input_tokens"),
        sa.func.sum(model_usage.c.output_tokens).label("output_tokens"),
    ]
