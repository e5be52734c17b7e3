"""Everyone's sessions newest first: an index on `sessions (created_at, id)`.

An admin's listing (`GET /v1/sessions`, the dashboard's sessions page) orders every owner's
sessions by `created_at DESC, id DESC`; the only index on `created_at` led with `owner_id`, so
with 100,000 sessions each page sorted them all (about a second). Plain CREATE INDEX.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_sessions_newest_first", "sessions", ["created_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_sessions_newest_first", table_name="sessions")
