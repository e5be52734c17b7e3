"""Native session retry (spec document 5): the retry decision, its index, the kill switch.

The chain's columns (`parent_session_id`, `retry_count`, `max_retries`, `retry_policy`,
`retry_cause`) exist since 0001. This adds `sessions.retry_decision` (what became of an ended
session's retry; NULL until decided), the partial index of the sessions whose retry is still to
be decided (only sessions with a policy are in it, and they leave it once decided), and
`cluster_settings`, where the admins' switch that pauses automatic retries is kept. Plain ALTER
TABLE, never a batch copy of `sessions` (see 0009).

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
UNDECIDED = sa.text("max_retries > 0 AND retry_decision IS NULL")  # tables.RETRY_UNDECIDED


def upgrade() -> None:
    op.add_column("sessions", sa.Column("retry_decision", sa.String(length=16), nullable=True))
    op.create_index(
        "ix_sessions_retry_undecided",
        "sessions",
        ["status"],
        postgresql_where=UNDECIDED,
        sqlite_where=UNDECIDED,
    )
    op.create_table(
        "cluster_settings",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", JSON, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_by", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("name", name="pk_cluster_settings"),
    )


def downgrade() -> None:
    op.drop_table("cluster_settings")
    op.drop_index("ix_sessions_retry_undecided", table_name="sessions")
    op.drop_column("sessions", "retry_decision")
