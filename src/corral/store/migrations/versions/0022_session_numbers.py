"""Short session numbers: a cluster-wide integer per session, increasing in creation order.

UUIDv7 prefixes of sessions created together share their leading digits, so a prefix is no
handle to type; a number is. Existing sessions are numbered 1, 2, ... by creation time. New
numbers come from the sequence `session_numbers` on PostgreSQL and from the row of that name
in `counters` on SQLite (`store.session_numbers`); both go on from the highest number given.

Sessions are also found by name: a partial index holds the named ones.

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

SESSION_NUMBERS = "session_numbers"  # as `store.session_numbers` names it (frozen here)
NAMED = sa.text("name IS NOT NULL")


def upgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        "counters",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_counters"),
    )
    # Plain ALTER TABLE, never a batch copy of `sessions` (see 0009). SQLite adds a NOT NULL
    # column only with a default: 0, which no session keeps (every row is numbered below, and
    # the unique index refuses a second 0).
    if postgresql:
        op.add_column("sessions", sa.Column("number", sa.BigInteger(), nullable=True))
    else:
        op.add_column(
            "sessions",
            sa.Column("number", sa.Integer(), nullable=False, server_default=sa.text("0")),
        )
    op.execute(
        "UPDATE sessions SET number = numbered.n FROM ("
        " SELECT id, row_number() OVER (ORDER BY created_at, id) AS n FROM sessions"
        ") AS numbered WHERE sessions.id = numbered.id"
    )
    highest = "(SELECT coalesce(max(number), 0) FROM sessions)"
    if postgresql:
        op.alter_column("sessions", "number", nullable=False)
        op.execute(f"CREATE SEQUENCE {SESSION_NUMBERS} AS bigint")
        op.execute(f"SELECT setval('{SESSION_NUMBERS}', {highest} + 1, false)")
    else:
        op.execute(f"INSERT INTO counters (name, value) VALUES ('{SESSION_NUMBERS}', {highest})")
    op.create_index("uq_sessions_number", "sessions", ["number"], unique=True)
    op.create_index(
        "ix_sessions_name", "sessions", ["name"], postgresql_where=NAMED, sqlite_where=NAMED
    )


def downgrade() -> None:
    op.drop_index("ix_sessions_name", table_name="sessions")
    op.drop_index("uq_sessions_number", table_name="sessions")
    op.drop_column("sessions", "number")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"DROP SEQUENCE {SESSION_NUMBERS}")
    op.drop_table("counters")
