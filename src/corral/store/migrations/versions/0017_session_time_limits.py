"""Wall-time limits: a session's limit, and while it runs the moment it is due to stop.

`time_limit_s` is written at submission (the spec's, else its group's default); `deadline_at`
is set by the move to RUNNING (start + limit) and cleared by the move out of it, so the partial
index holds exactly the running sessions that have a limit: the time-limit task reads the due
ones and the next deadline from it, whatever the number of sessions. Plain ALTER TABLE on both
backends, never a batch copy of `sessions` (see 0009).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("time_limit_s", sa.Integer(), nullable=True))
    op.add_column("sessions", sa.Column("deadline_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index(
        "ix_sessions_deadline_at",
        "sessions",
        ["deadline_at"],
        postgresql_where=sa.text("deadline_at IS NOT NULL"),
        sqlite_where=sa.text("deadline_at IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_sessions_deadline_at", table_name="sessions")
    op.drop_column("sessions", "deadline_at")
    op.drop_column("sessions", "time_limit_s")
