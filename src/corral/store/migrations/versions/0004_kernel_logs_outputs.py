"""Kernels' logs and outputs, as their agents upload them.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "kernel_logs",
        sa.Column("kernel_id", sa.Uuid(), nullable=False),
        sa.Column("stream", sa.String(length=16), nullable=False),
        sa.Column("byte_offset", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "stream IN ('stdout', 'stderr')", name=op.f("ck_kernel_logs_stream_valid")
        ),
        sa.CheckConstraint("byte_offset >= 0", name=op.f("ck_kernel_logs_offset_not_negative")),
        sa.PrimaryKeyConstraint("kernel_id", "stream", "byte_offset", name=op.f("pk_kernel_logs")),
    )
    op.create_table(
        "kernel_outputs",
        sa.Column("kernel_id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.String(length=512), nullable=False),
        sa.Column("size_bytes", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("kernel_id", "name", name=op.f("pk_kernel_outputs")),
    )


def downgrade() -> None:
    op.drop_table("kernel_outputs")
    op.drop_table("kernel_logs")
