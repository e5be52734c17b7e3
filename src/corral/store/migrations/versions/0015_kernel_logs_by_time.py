"""Index kernels' log chunks by the time they were stored, for `session logs --since`.

`--since 10m` starts at the first chunk of a stream stored at or after a time; without the
index that is a walk over every chunk of the stream (and on SQLite over each chunk's data,
which the row keeps before its time). One entry per chunk of up to 256 KiB.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

INDEX = "ix_kernel_logs_kernel_id_stream_created_at_byte_offset"


def upgrade() -> None:
    op.create_index(
        INDEX, "kernel_logs", ["kernel_id", "stream", "created_at", "byte_offset"], unique=False
    )


def downgrade() -> None:
    op.drop_index(INDEX, table_name="kernel_logs")
