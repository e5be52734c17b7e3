"""Job arrays by number, elements as `12_7`; which sessions use which upload, and when an
upload was last asked for (the retention task deletes the ones no session uses).

`array_number` is the number users type for a whole array: its first element's session
number (Slurm's array job id is its first task's job id). Every element carries it, so `12_7`
is one look-up in a unique partial index on (array_number, array_index), and agents give it to
kernels as CORRAL_ARRAY_ID without a join. Existing arrays get their first element's number.

`sessions.upload` is the digest the session's spec names (also in `spec`), as a column so that
the retention task finds the uploads no kept session uses through an index instead of reading
every spec. `uploads.used_at` is when the upload was stored or last asked for by its owner
(the client asks before it submits): an upload no session uses is deleted only once that is
older than the manager's bound, so a submission in flight never loses its upload.

Revision ID: 0023
Revises: 0022
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

IN_ARRAY = sa.text("array_number IS NOT NULL")
WITH_UPLOAD = sa.text("upload IS NOT NULL")
BigID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")  # as `store.tables` (frozen here)


def upgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    # Plain ADD COLUMNs (nullable, no default): no copy of `sessions` (see 0009).
    op.add_column("sessions", sa.Column("array_number", BigID, nullable=True))
    op.add_column("sessions", sa.Column("upload", sa.String(length=64), nullable=True))
    op.execute(
        "UPDATE sessions SET array_number = (SELECT head.number FROM sessions AS head"
        " WHERE head.id = sessions.array_id) WHERE array_id IS NOT NULL"
    )
    upload_of_spec = "spec ->> 'upload'" if postgresql else "json_extract(spec, '$.upload')"
    op.execute(f"UPDATE sessions SET upload = {upload_of_spec} WHERE {upload_of_spec} IS NOT NULL")
    op.create_index(
        "uq_sessions_array_number_array_index",
        "sessions",
        ["array_number", "array_index"],
        unique=True,
        postgresql_where=IN_ARRAY,
        sqlite_where=IN_ARRAY,
    )
    op.create_index(
        "ix_sessions_upload",
        "sessions",
        ["upload"],
        postgresql_where=WITH_UPLOAD,
        sqlite_where=WITH_UPLOAD,
    )
    op.add_column("uploads", sa.Column("used_at", sa.DateTime(timezone=True), nullable=True))
    op.execute("UPDATE uploads SET used_at = created_at")
    # `uploads` is small and nothing refers to it: a batch copy on SQLite is harmless here.
    with op.batch_alter_table("uploads") as batch:
        batch.alter_column("used_at", nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("uploads") as batch:
        batch.drop_column("used_at")
    op.drop_index("ix_sessions_upload", table_name="sessions")
    op.drop_index("uq_sessions_array_number_array_index", table_name="sessions")
    # Plain DROP COLUMNs, as 0020 does: a batch copy on SQLite would cascade into `kernels`.
    op.drop_column("sessions", "upload")
    op.drop_column("sessions", "array_number")
