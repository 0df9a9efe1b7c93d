"""Work items as records of their own (issue 30): `work_items`, an id unique in its namespace with a title, body,
state and labels, and `work_item_events`, its entries in order (created, comments, state changes, artifacts), each
with its author and, for an agent, the fence it wrote under. They replace `comments`, which nothing wrote.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

Timestamp = sa.DateTime(timezone=True)
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "work_items",
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("item_id", sa.String(1024), nullable=False),
        sa.Column("title", sa.String(512), nullable=False),
        sa.Column("body", sa.Text, nullable=False, server_default=""),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("labels", sa.JSON, nullable=False),
        sa.Column("created_by", sa.String(512), nullable=False),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("namespace", "item_id", name="pk_work_items"),
    )
    op.create_table(
        "work_item_events",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("work_item_ref", sa.String(63 + 1 + 1024), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("body", sa.Text, nullable=False, server_default=""),
        sa.Column("data", sa.JSON, nullable=True),
        sa.Column("author", sa.String(512), nullable=True),
        sa.Column("run", sa.String(512), nullable=True),
        sa.Column("run_uid", sa.String(128), nullable=True),
        sa.Column("attempt", sa.Integer, nullable=True),
        sa.Column("fence", sa.BigInteger, nullable=True),
        sa.Column("at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_work_item_events"),
        sa.UniqueConstraint("work_item_ref", "seq", name="uq_work_item_events_work_item_ref_seq"),
    )
    op.drop_index("ix_comments_work_item_ref", table_name="comments")
    op.drop_table("comments")


def downgrade() -> None:
    op.create_table(
        "comments",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("work_item_ref", sa.String(63 + 1 + 1024), nullable=False),
        sa.Column("run_uid", sa.String(128), nullable=False),
        sa.Column("run", sa.String(512), nullable=False),
        sa.Column("fence", sa.BigInteger, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("triggered_by", sa.String(512), nullable=True),
        sa.Column("at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_comments"),
    )
    op.create_index("ix_comments_work_item_ref", "comments", ["work_item_ref"])
    op.drop_table("work_item_events")
    op.drop_table("work_items")
