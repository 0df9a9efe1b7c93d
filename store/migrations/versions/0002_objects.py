"""The embedded default's objects (Runs, Agents, ModelEndpoints... applied with `ksquad run -f`) and the
statuses of its Runs.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "objects",
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("namespace", sa.String(253), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("uid", sa.String(128), nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.Column("spec", sa.JSON, nullable=False),
        sa.Column("status", sa.JSON, nullable=True),
        sa.Column("revision", sa.BigInteger, nullable=False, server_default="0"),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("kind", "namespace", "name", name="pk_objects"),
    )


def downgrade() -> None:
    op.drop_table("objects")
