"""Squad memory (issue 46): `squad_memory`, a Team's or a Project's entries, attributed (store.memory).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

Timestamp = sa.DateTime(timezone=True)
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "squad_memory",
        sa.Column("id", BigId, primary_key=True, autoincrement=True),
        sa.Column("namespace", sa.String(63), nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("name", sa.String(253), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("author", sa.String(512), nullable=True),
        sa.Column("run", sa.String(512), nullable=True),
        sa.Column("run_uid", sa.String(128), nullable=True),
        sa.Column("attempt", sa.Integer, nullable=True),
        sa.Column("fence", sa.BigInteger, nullable=True),
        sa.Column("edited_by", sa.String(512), nullable=True),
        sa.Column("created_at", Timestamp, nullable=False),
        sa.Column("updated_at", Timestamp, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_squad_memory"),
    )
    op.create_index(
        "ix_squad_memory_namespace_scope_name_id", "squad_memory", ["namespace", "scope", "name", "id"]
    )


def downgrade() -> None:
    op.drop_index("ix_squad_memory_namespace_scope_name_id", table_name="squad_memory")
    op.drop_table("squad_memory")
