"""The latest limit on each credential, readable at once by a run subscribing to its throttle (the throttle
workflow's memo lags behind its signals under load).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "credential_limits",
        sa.Column("credential", sa.String(320), nullable=False),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("strikes", sa.Integer, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("credential", name="pk_credential_limits"),
    )


def downgrade() -> None:
    op.drop_table("credential_limits")
