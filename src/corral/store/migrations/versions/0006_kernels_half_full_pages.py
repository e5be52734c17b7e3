"""Kernel pages kept half empty on PostgreSQL, so a batch of status changes stays HOT.

A status change rewrites the kernel row; it is a HOT update (no index entries, one WAL record)
only if the new version fits on the same page. A batch moves every kernel of a page at once,
and 20 % of free space held about a quarter of them: the rest were full updates with three
index entries each. Half-empty pages hold a new version of every row.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE kernels SET (fillfactor = 50)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE kernels SET (fillfactor = 80)")
