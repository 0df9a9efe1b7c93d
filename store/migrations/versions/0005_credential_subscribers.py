"""The runs subscribed to each credential's limits, kept in the store instead of in the credential's throttle
workflow: subscribing is a row, not a signal-with-start and a workflow task of the throttle.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "credential_subscribers",
        sa.Column("credential", sa.String(320), nullable=False),
        sa.Column("workflow_id", sa.String(512), nullable=False),
        sa.Column("subscribed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("credential", "workflow_id", name="pk_credential_subscribers"),
    )


def downgrade() -> None:
    op.drop_table("credential_subscribers")
