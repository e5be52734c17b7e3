"""The kernels with a failed stage reported, by session: a partial index.

The phases that watch sessions in a status (PREPARING, CREATING, RUNNING, ...) look for the few
whose kernels reported a failed stage or sit on an agent that is no longer ALIVE. They read
every watched session's kernels for that, on each run; with this index (and `agent_kernels` for
the agents) they read only the kernels in question.

Revision ID: 0033
Revises: 0032
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_kernels_stage_failure",
        "kernels",
        ["session_id"],
        postgresql_where=sa.text("stage_failure IS NOT NULL"),
        sqlite_where=sa.text("stage_failure IS NOT NULL"),
    )


def downgrade() -> None:
    op.drop_index("ix_kernels_stage_failure", table_name="kernels")
