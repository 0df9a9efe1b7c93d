"""Durable agent progress (issue 46): `agent_checkpoints`, each attempt's completed steps as its agent recorded
them under its fence (store.checkpoints).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

Timestamp = sa.DateTime(timezone=True)
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "agent_checkpoints",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("run_uid", sa.String(128), nullable=False),
        sa.Column("run", sa.String(512), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("fence", sa.BigInteger, nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column("size", sa.Integer, nullable=False),
        sa.Column("at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_agent_checkpoints"),
    )
    op.create_index("ix_agent_checkpoints_run_uid_id", "agent_checkpoints", ["run_uid", "id"])


def downgrade() -> None:
    op.drop_index("ix_agent_checkpoints_run_uid_id", table_name="agent_checkpoints")
    op.drop_table("agent_checkpoints")
