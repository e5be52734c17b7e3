"""Idempotency keys compare requests: each session made with a `creation_id` keeps the
fingerprint of the request that made it (`domain.idempotency`), so the same key with a
different request is refused, naming the fields that differ. NULL: made without a key, or
before this revision (such a session answers any request under its key, as before).

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Plain ALTER TABLE, never a batch copy of `sessions` (see 0009).
    json_type = sa.JSON(none_as_null=True).with_variant(
        postgresql.JSONB(none_as_null=True), "postgresql"
    )
    op.add_column("sessions", sa.Column("creation_fingerprint", json_type, nullable=True))


def downgrade() -> None:
    op.drop_column("sessions", "creation_fingerprint")
