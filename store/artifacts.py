"""Run artifacts: fenced rows, a later attempt's artifact replacing an earlier one's of the same name."""

import sqlalchemy as sa

from store.base import StoreBase
from store.connection import unavailable
from store.records import Holder
from store.schema import artifacts


class Artifacts(StoreBase):
    @unavailable
    async def put_artifact(
        self,
        holder: Holder,
        fence: int,
        name: str,
        *,
        uri: str | None = None,
        media_type: str | None = None,
        content: bytes | None = None,
        work_item_ref: str | None = None,
    ) -> int:
        async with self.engine.begin() as c:
            row = await self._fenced_insert(
                c,
                artifacts,
                {
                    "run_uid": holder.uid,
                    "run": holder.run,
                    "work_item_ref": work_item_ref,
                    "fence": fence,
                    "name": name,
                    "uri": uri,
                    "media_type": media_type,
                    "size": len(content) if content is not None else None,
                    "content": content,
                    "triggered_by": holder.triggered_by,
                    "at": self.clock(),
                },
                holder,
                fence,
                work_item_ref,
                replace_on=["run_uid", "name"],
            )
            return int(row.id)

    @unavailable
    async def artifact(self, run_uid: str, name: str) -> tuple[str | None, bytes] | None:
        """An artifact's media type and content, or None when the run has no artifact of that name."""
        async with self.engine.connect() as c:
            row = (
                await c.execute(
                    sa.select(artifacts.c.media_type, artifacts.c.content).where(
                        artifacts.c.run_uid == run_uid, artifacts.c.name == name
                    )
                )
            ).first()
            return (row.media_type, bytes(row.content or b"")) if row else None
