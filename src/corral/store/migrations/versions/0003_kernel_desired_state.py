"""Kernels' desired state: what agents are asked to do, and their retryable stage failures.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("kernels") as batch:
        batch.add_column(sa.Column("desired_state", sa.String(length=16), nullable=True))
        batch.add_column(
            sa.Column("desired_generation", sa.Integer(), server_default="0", nullable=False)
        )
        batch.add_column(sa.Column("stage_failure", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("kernels") as batch:
        batch.drop_column("stage_failure")
        batch.drop_column("desired_generation")
        batch.drop_column("desired_state")
