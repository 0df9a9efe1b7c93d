"""Work items keyed by namespace: a claim, its history and the rows written under it are keyed
"<namespace>/<workItemRef>" (store.work_item_key), not by the bare ref that two namespaces could share; the
columns widen to hold it. Rows already there take the namespace of the run that wrote them; a claim, of its
holder or its last holder.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# Tables whose rows name the run that wrote them ("<namespace>/<name>"), and that column.
WRITTEN_BY = {"claim_history": "holder_run", "run_events": "run", "artifacts": "run", "comments": "run"}
KEY_LENGTH, REF_LENGTH = 63 + 1 + 1024, 1024


def widen(length: int) -> None:
    for table in ("claims", *WRITTEN_BY):
        with op.batch_alter_table(table) as batch:
            batch.alter_column("work_item_ref", type_=sa.String(length), existing_type=sa.String())


def namespace_of(column: str) -> str:
    """SQL for the namespace of a "<namespace>/<name>" column, with its slash."""
    if op.get_bind().dialect.name == "postgresql":
        return f"(split_part({column}, '/', 1) || '/')"
    return f"substr({column}, 1, instr({column}, '/'))"


def upgrade() -> None:
    widen(KEY_LENGTH)
    last_holder = (
        "(SELECT h.holder_run FROM claim_history h WHERE h.work_item_ref = claims.work_item_ref "
        "ORDER BY h.id DESC LIMIT 1)"
    )
    holder = f"coalesce(claims.holder_run, {last_holder})"
    op.execute(
        f"UPDATE claims SET work_item_ref = {namespace_of(holder)} || work_item_ref WHERE {holder} IS NOT NULL"
    )
    for table, run in WRITTEN_BY.items():
        op.execute(
            f"UPDATE {table} SET work_item_ref = {namespace_of(run)} || work_item_ref WHERE work_item_ref IS NOT NULL"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        strip = "substr(work_item_ref, strpos(work_item_ref, '/') + 1)"
    else:
        strip = "substr(work_item_ref, instr(work_item_ref, '/') + 1)"
    for table in ("claims", *WRITTEN_BY):
        op.execute(f"UPDATE {table} SET work_item_ref = {strip} WHERE work_item_ref IS NOT NULL")
    widen(REF_LENGTH)
