"""Each kernel's placement attempt, bumped by every placement.

A kernel placed again after going back to PENDING was the same row under the same id, so an
agent's late report of the earlier placement (or its finished worker) could be taken for the
new one. Assignments and reports now carry the attempt.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


# Plain ALTER TABLE on both backends (a constant default: no table rewrite on PostgreSQL,
# no batch copy on SQLite).


def upgrade() -> None:
    op.add_column(
        "kernels",
        sa.Column("attempt", sa.Integer(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_column("kernels", "attempt")
