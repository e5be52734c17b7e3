"""Kernel history indexed by session, not by kernel.

Nothing reads a kernel's history by kernel: it is read, and deleted with its session, by
session, and the delete had no index to use (a full scan of every kernel's history on each
`corral session rm`). The rows of one session's kernels are written together, so the new
index is also cheaper to keep up than one keyed by random kernel ids.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("kernel_scheduling_history", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_kernel_scheduling_history_session_id_id"),
            ["session_id", "id"],
            unique=False,
        )
        batch_op.drop_index(batch_op.f("ix_kernel_scheduling_history_kernel_id_id"))


def downgrade() -> None:
    with op.batch_alter_table("kernel_scheduling_history", schema=None) as batch_op:
        batch_op.create_index(
            batch_op.f("ix_kernel_scheduling_history_kernel_id_id"),
            ["kernel_id", "id"],
            unique=False,
        )
        batch_op.drop_index(batch_op.f("ix_kernel_scheduling_history_session_id_id"))
