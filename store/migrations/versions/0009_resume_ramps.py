"""Fair resume ramps (issue 31): `resume_ramps`, the runs waiting to call again after a credential's limit, each
with its tenant's virtual finish (store.ramps).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

Timestamp = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "resume_ramps",
        sa.Column("ramp", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(512), nullable=False),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("finish", sa.Float, nullable=False),
        sa.Column("seq", sa.BigInteger, nullable=False),
        sa.Column("released", sa.Boolean, nullable=False),
        sa.Column("opens", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("ramp", "run_id", name="pk_resume_ramps"),
    )
    op.create_index("ix_resume_ramps_ramp_finish", "resume_ramps", ["ramp", "finish"])
    op.create_index("ix_resume_ramps_opens", "resume_ramps", ["opens"])


def downgrade() -> None:
    op.drop_index("ix_resume_ramps_opens", table_name="resume_ramps")
    op.drop_index("ix_resume_ramps_ramp_finish", table_name="resume_ramps")
    op.drop_table("resume_ramps")
