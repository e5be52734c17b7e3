"""Directories users upload for their sessions (`corral run --upload`), by owner and digest.

An upload is a tar.gz the client builds deterministically, named by the sha256 of its bytes:
the same tree has the same digest, so it is stored once per owner and a second submit sends
nothing. A session names its upload in its spec; only the owner's uploads may be named
(`missing_uploads`, checked in the submitting transaction), and an agent reads the upload of a
kernel placed on it only (`kernel_upload`).

An upload is kept while a session names it (`sessions.upload`: until retention deletes the
session), and otherwise for a bound after it was stored or last asked for (`used_at`): the
client asks for it (`touch_upload`) just before it submits, so a submission in flight never
finds its upload deleted under it. `purge_unused_uploads` deletes the others.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.record import record
from corral.domain.types import AgentId, KernelId, UserId
from corral.store._sql import in_values
from corral.store.database import Database, Dialect
from corral.store.tables import kernels, sessions, uploads


@record
class UploadInfo:
    """One stored upload, without its bytes."""

    digest: str  # sha256 of the archive, lowercase hex
    size_bytes: int
    created_at: datetime


PURGE_UPLOADS_BATCH = 100  # uploads (up to the upload cap each) deleted per transaction
# A manager setting: how long an upload no session names is kept after its last use (0: ever).
DEFAULT_UNUSED_UPLOAD_HOURS = 24.0


async def touch_upload(
    db: Database, owner: UserId, digest: str, now: datetime
) -> UploadInfo | None:
    """The owner's upload of that digest, marked used now (kept a while longer); or None."""
    async with db.transaction() as conn:
        await conn.execute(
            uploads.update()
            .where(uploads.c.owner_id == owner, uploads.c.digest == digest)
            .values(used_at=now)
        )
        return await _info(conn, owner, digest)


async def purge_unused_uploads(
    db: Database, used_before: datetime, *, batch: int = PURGE_UPLOADS_BATCH
) -> int:
    """Delete up to `batch` uploads no session names that were last used before
    `used_before`, in one transaction; how many."""
    named = sa.select(sessions.c.id).where(
        sessions.c.upload == uploads.c.digest, sessions.c.owner_id == uploads.c.owner_id
    )
    async with db.transaction() as conn:
        rows = (
            await conn.execute(
                sa.select(uploads.c.owner_id, uploads.c.digest)
                .where(uploads.c.used_at < used_before, ~named.exists())
                .limit(batch)
            )
        ).all()
        for owner_id, digest in rows:
            # Checked again in the delete: a session submitted since the select keeps it.
            await conn.execute(
                uploads.delete().where(
                    uploads.c.owner_id == owner_id, uploads.c.digest == digest, ~named.exists()
                )
            )
    return len(rows)


async def store_upload(
    db: Database, owner: UserId, digest: str, data: bytes, now: datetime
) -> tuple[UploadInfo, bool]:
    """Keep the owner's upload; the stored upload and whether it was stored now (not before)."""
    row = {
        "owner_id": owner,
        "digest": digest,
        "size_bytes": len(data),
        "data": data,
        "created_at": now,
        "used_at": now,
    }
    insert = (postgresql.insert if db.dialect == "postgresql" else sqlite.insert)(uploads)
    touch = (
        uploads.update()
        .where(uploads.c.owner_id == owner, uploads.c.digest == digest)
        .values(used_at=now)
    )
    async with db.transaction() as conn:
        # The same tree may be uploaded by two submits of the owner at once: one row stays.
        # Twice at most: a row there at the insert may be purged before the touch.
        for _ in range(2):
            stored = await conn.execute(insert.values(row).on_conflict_do_nothing())
            if stored.rowcount == 1:
                return UploadInfo(digest, len(data), now), True
            if (await conn.execute(touch)).rowcount == 1:
                found = await _info(conn, owner, digest)
                assert found is not None
                return found, False
    raise RuntimeError(f"upload {digest} was stored and deleted again while it was sent")


async def missing_uploads(
    conn: AsyncConnection, dialect: Dialect, owner: UserId, digests: Collection[str]
) -> set[str]:
    """Which of `digests` the owner has not uploaded (in the caller's transaction)."""
    found = await conn.scalars(
        sa.select(uploads.c.digest).where(
            uploads.c.owner_id == owner, in_values(dialect, uploads.c.digest, set(digests))
        )
    )
    return set(digests) - set(found)


async def kernel_upload(db: Database, agent_id: AgentId, kernel_id: KernelId) -> bytes | None:
    """The upload the kernel's session names, if the kernel is placed on `agent_id`; else None."""
    async with db.read() as conn:
        row = (
            await conn.execute(
                sa.select(sessions.c.owner_id, sessions.c.spec)
                .select_from(kernels.join(sessions, kernels.c.session_id == sessions.c.id))
                .where(kernels.c.id == kernel_id, kernels.c.agent_id == agent_id)
            )
        ).first()
        digest = (row.spec or {}).get("upload") if row is not None else None
        if row is None or not digest:
            return None
        data = await conn.scalar(
            sa.select(uploads.c.data).where(
                uploads.c.owner_id == row.owner_id, uploads.c.digest == digest
            )
        )
    return None if data is None else bytes(data)


async def _info(conn: AsyncConnection, owner: UserId, digest: str) -> UploadInfo | None:
    row = (
        await conn.execute(
            sa.select(uploads.c.size_bytes, uploads.c.created_at).where(
                uploads.c.owner_id == owner, uploads.c.digest == digest
            )
        )
    ).first()
    return None if row is None else UploadInfo(digest, row.size_bytes, row.created_at)
