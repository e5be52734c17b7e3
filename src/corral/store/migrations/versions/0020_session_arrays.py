"""Job arrays: which array a session belongs to, its index there, and the array's throttle.

A job array (`corral run --array 0-99%5`) is created as one session per index in one
transaction. Every element names the array by its first element's id (`array_id`), carries
its own index, and the array's throttle (how many of its elements may hold resources at once;
NULL: no cap). The scheduler counts an array's active elements by `array_id`, and `session
ls/terminate` find an array's elements by it: indexed, partial, so sessions outside arrays
cost the index nothing.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

IN_ARRAY = sa.text("array_id IS NOT NULL")


def upgrade() -> None:
    # Plain ADD COLUMNs (nullable, no default): no table rewrite on either backend.
    op.add_column("sessions", sa.Column("array_id", sa.Uuid(), nullable=True))
    op.add_column("sessions", sa.Column("array_index", sa.Integer(), nullable=True))
    op.add_column("sessions", sa.Column("array_throttle", sa.Integer(), nullable=True))
    op.create_index(
        "ix_sessions_array_id",
        "sessions",
        ["array_id"],
        postgresql_where=IN_ARRAY,
        sqlite_where=IN_ARRAY,
    )


def downgrade() -> None:
    op.drop_index("ix_sessions_array_id", table_name="sessions")
    # Plain DROP COLUMNs, as 0017 does: a batch (copy-and-move) on SQLite drops the old sessions
    # table, whose ON DELETE CASCADE empties `kernels`.
    op.drop_column("sessions", "array_throttle")
    op.drop_column("sessions", "array_index")
    op.drop_column("sessions", "array_id")
