"""Model usage (issue 31): `model_usage`, one row per model call of a run's attempt, as its agent reported it,
with the credential and the person it is charged to.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

Timestamp = sa.DateTime(timezone=True)
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "model_usage",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("run", sa.String(512), nullable=False),
        sa.Column("run_uid", sa.String(128), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("call_id", sa.String(64), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("credential", sa.String(512), nullable=False),
        sa.Column("triggered_by", sa.String(512), nullable=False),
        sa.Column("input_tokens", sa.BigInteger, nullable=False),
        sa.Column("output_tokens", sa.BigInteger, nullable=False),
        sa.Column("latency_ms", sa.BigInteger, nullable=False),
        sa.Column("at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_model_usage"),
        sa.UniqueConstraint("run_uid", "attempt", "call_id", name="uq_model_usage_run_uid_attempt_call_id"),
    )
    op.create_index("ix_model_usage_at", "model_usage", ["at"])


def downgrade() -> None:
    op.drop_index("ix_model_usage_at", table_name="model_usage")
    op.drop_table("model_usage")
