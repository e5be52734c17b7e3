"""Make the PostgreSQL hints table UNLOGGED.

A hint is not truth: a lost one costs latency until the next long loop, never a session
(DESIGN.md, "Coordination"). A logged table made every hint set and consume wait for a WAL
flush, and both happen on every phase of every session. An unlogged table writes no WAL; after
a server crash PostgreSQL empties it, which the long loop covers. SQLite has no such thing (its
bus is in-process or Redis), so this is PostgreSQL's alone.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE hints SET UNLOGGED")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE hints SET LOGGED")
