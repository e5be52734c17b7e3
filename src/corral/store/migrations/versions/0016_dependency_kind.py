"""A kind per session dependency: Slurm's afterok (the default), afterany, afternotok.

Existing rows become afterok, what every dependency meant so far. A plain ALTER TABLE on both
backends (the column's CHECK is part of its definition), never a batch copy.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

KINDS = ("afterok", "afterany", "afternotok")


def upgrade() -> None:
    allowed = ", ".join(f"'{kind}'" for kind in KINDS)
    op.add_column(
        "session_dependencies",
        sa.Column(
            "kind",
            sa.String(16),
            sa.CheckConstraint(f"kind IN ({allowed})", name="ck_session_dependencies_kind_valid"),
            nullable=False,
            server_default="afterok",
        ),
    )


def downgrade() -> None:
    op.drop_column("session_dependencies", "kind")
