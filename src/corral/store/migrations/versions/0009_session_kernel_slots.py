"""What every kernel of a session requests, on the session's row.

Placement read each pending session joined with its first kernel, and checked the other
kernels for a different request: two index probes per session, 60 of the 70 ms PostgreSQL
spent loading 10,000 four-kernel sessions. The session row now says it (NULL when its kernels
ask different amounts, which only such sessions' kernels are then read for).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


# Plain ALTER TABLE on both backends, never a batch copy of `sessions`: on SQLite that drops
# the old table, and with foreign keys on, dropping it deletes every kernel (ON DELETE CASCADE).


def upgrade() -> None:
    op.add_column(
        "sessions",
        sa.Column(
            "kernel_slots",
            sa.JSON(none_as_null=True).with_variant(
                postgresql.JSONB(none_as_null=True, astext_type=sa.Text()), "postgresql"
            ),
            nullable=True,
        ),
    )
    op.execute(
        "UPDATE sessions SET kernel_slots = ("
        " SELECT first.requested_slots FROM kernels first"
        " WHERE first.session_id = sessions.id AND first.cluster_index = 0"
        " AND NOT EXISTS (SELECT 1 FROM kernels other WHERE other.session_id = sessions.id"
        " AND CAST(other.requested_slots AS TEXT) <> CAST(first.requested_slots AS TEXT)))"
    )


def downgrade() -> None:
    op.drop_column("sessions", "kernel_slots")
