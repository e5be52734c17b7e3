"""When a started kernel's agent last confirmed it, and the manager's open question about it.

A started kernel (RUNNING, TERMINATING) had no bound: a report lost for good left it, its
session and its slots where they were forever. The manager now asks an agent about a kernel it
has been quiet about for its status's bound (`asked_at`), and fails it `agent_lost` if the
question stays unanswered; an answer sets `heard_at` (store.kernel_checks).

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("kernels", sa.Column("heard_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("kernels", sa.Column("asked_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("kernels", "asked_at")
    op.drop_column("kernels", "heard_at")
