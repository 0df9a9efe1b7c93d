"""Phase events carry the status revision they record, so a status sent again (a retried or coalesced
snapshot) adds no second event: the bridge records phases into the same log as the agent's progress.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("run_events", sa.Column("revision", sa.BigInteger, nullable=True))
    op.create_index("ix_run_events_run_uid_revision", "run_events", ["run_uid", "revision"])


def downgrade() -> None:
    op.drop_index("ix_run_events_run_uid_revision", "run_events")
    op.drop_column("run_events", "revision")
