"""An index for one entity's events in order.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(op.f("ix_events_entity_id_id"), "events", ["entity_id", "id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_events_entity_id_id"), table_name="events")
