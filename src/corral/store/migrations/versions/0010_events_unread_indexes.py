"""Drop the two indexes of `events` that no query reads.

The event log is read by id (the stream, `corral events`) and by entity in id order (`corral
run` following its session); nothing reads it by (entity type, entity) or by time. Every
status change appends an event (eight a session through its lifecycle), and each index is
one more entry written per event.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index(op.f("ix_events_entity_type_entity_id"), table_name="events")
    op.drop_index(op.f("ix_events_created_at"), table_name="events")


def downgrade() -> None:
    op.create_index(op.f("ix_events_created_at"), "events", ["created_at"], unique=False)
    op.create_index(
        op.f("ix_events_entity_type_entity_id"),
        "events",
        ["entity_type", "entity_id"],
        unique=False,
    )
