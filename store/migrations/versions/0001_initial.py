"""The coordination store: claims with fences, claim history, run fences, events, comments, artifacts.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

Timestamp = sa.DateTime(timezone=True)
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "claims",
        sa.Column("work_item_ref", sa.String(1024), nullable=False),
        sa.Column("holder_uid", sa.String(128), nullable=True),
        sa.Column("holder_run", sa.String(512), nullable=True),
        sa.Column("previous_holder_uid", sa.String(128), nullable=True),
        sa.Column("fence", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("lease_expires_at", Timestamp, nullable=True),
        sa.Column("triggered_by", sa.String(512), nullable=True),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("work_item_ref", name="pk_claims"),
    )
    op.create_table(
        "claim_history",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("work_item_ref", sa.String(1024), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("holder_uid", sa.String(128), nullable=False),
        sa.Column("holder_run", sa.String(512), nullable=False),
        sa.Column("fence", sa.BigInteger, nullable=False),
        sa.Column("previous_holder_uid", sa.String(128), nullable=True),
        sa.Column("triggered_by", sa.String(512), nullable=True),
        sa.Column("at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_claim_history"),
    )
    op.create_index("ix_claim_history_work_item_ref", "claim_history", ["work_item_ref"])
    op.create_table(
        "run_fences",
        sa.Column("run_uid", sa.String(128), nullable=False),
        sa.Column("run", sa.String(512), nullable=False),
        sa.Column("fence", sa.BigInteger, nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("run_uid", name="pk_run_fences"),
    )
    op.create_table(
        "run_sequences",
        sa.Column("run_uid", sa.String(128), nullable=False),
        sa.Column("last_seq", sa.BigInteger, nullable=False),
        sa.PrimaryKeyConstraint("run_uid", name="pk_run_sequences"),
    )
    op.create_table(
        "run_events",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("run_uid", sa.String(128), nullable=False),
        sa.Column("run", sa.String(512), nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("work_item_ref", sa.String(1024), nullable=True),
        sa.Column("fence", sa.BigInteger, nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("message", sa.Text, nullable=False, server_default=""),
        sa.Column("data", sa.JSON, nullable=True),
        sa.Column("triggered_by", sa.String(512), nullable=True),
        sa.Column("at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_run_events"),
        sa.UniqueConstraint("run_uid", "seq", name="uq_run_events_run_uid_seq"),
    )
    op.create_table(
        "comments",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("work_item_ref", sa.String(1024), nullable=False),
        sa.Column("run_uid", sa.String(128), nullable=False),
        sa.Column("run", sa.String(512), nullable=False),
        sa.Column("fence", sa.BigInteger, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.Column("triggered_by", sa.String(512), nullable=True),
        sa.Column("at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_comments"),
    )
    op.create_index("ix_comments_work_item_ref", "comments", ["work_item_ref"])
    op.create_table(
        "artifacts",
        sa.Column("id", BigId, autoincrement=True, nullable=False),
        sa.Column("run_uid", sa.String(128), nullable=False),
        sa.Column("run", sa.String(512), nullable=False),
        sa.Column("work_item_ref", sa.String(1024), nullable=True),
        sa.Column("fence", sa.BigInteger, nullable=False),
        sa.Column("name", sa.String(512), nullable=False),
        sa.Column("uri", sa.Text, nullable=True),
        sa.Column("media_type", sa.String(256), nullable=True),
        sa.Column("size", sa.BigInteger, nullable=True),
        sa.Column("content", sa.LargeBinary, nullable=True),
        sa.Column("triggered_by", sa.String(512), nullable=True),
        sa.Column("at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_artifacts"),
        sa.UniqueConstraint("run_uid", "name", name="uq_artifacts_run_uid_name"),
    )


def downgrade() -> None:
    for table in (
        "artifacts",
        "comments",
        "run_events",
        "run_sequences",
        "run_fences",
        "claim_history",
        "claims",
    ):
        op.drop_table(table)
