"""Kernels' logs and outputs, as agents upload them, and reading them back.

Log chunks are keyed by (kernel, stream, byte offset): an agent that re-sends chunks after a
lost reply writes nothing twice, and reading a stream is the chunks in offset order. Only the
agent a kernel is placed on may upload for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.record import record
from corral.domain.types import AgentId, KernelId
from corral.store._sql import in_values
from corral.store.database import Database, Dialect
from corral.store.tables import kernel_logs, kernel_outputs, kernels


@record
class LogChunk:
    """Bytes of one kernel's stdout or stderr, starting at `offset` in that stream."""

    kernel_id: KernelId
    stream: str  # stdout | stderr
    offset: int
    data: bytes


@record
class OutputBlob:
    """One file a kernel left in its output directory."""

    kernel_id: KernelId
    name: str
    data: bytes


class UploadRefusedError(ValueError):
    """An upload names kernels not placed on the uploading agent."""


async def append_log_chunks(
    db: Database, agent_id: AgentId, chunks: Sequence[LogChunk], now: datetime
) -> None:
    """Store the chunks (all or none); chunks already stored are left as they are."""
    if not chunks:
        return
    rows = [
        {
            "kernel_id": c.kernel_id,
            "stream": c.stream,
            "byte_offset": c.offset,
            "data": c.data,
            "created_at": now,
        }
        for c in chunks
    ]
    async with db.transaction() as conn:
        await _check_owner(conn, db.dialect, agent_id, {c.kernel_id for c in chunks})
        await conn.execute(_insert_ignoring_duplicates(db.dialect, kernel_logs), rows)


async def store_outputs(
    db: Database, agent_id: AgentId, outputs: Sequence[OutputBlob], now: datetime
) -> None:
    """Store a kernel's output files (all or none); a file stored before is kept."""
    if not outputs:
        return
    rows = [
        {
            "kernel_id": o.kernel_id,
            "name": o.name,
            "size_bytes": len(o.data),
            "data": o.data,
            "created_at": now,
        }
        for o in outputs
    ]
    async with db.transaction() as conn:
        await _check_owner(conn, db.dialect, agent_id, {o.kernel_id for o in outputs})
        await conn.execute(_insert_ignoring_duplicates(db.dialect, kernel_outputs), rows)


async def read_log(db: Database, kernel_id: KernelId, stream: str, offset: int = 0) -> bytes:
    """The stream's bytes from `offset` on, as far as they are contiguous."""
    async with db.read() as conn:
        rows = await conn.execute(
            sa.select(kernel_logs.c.byte_offset, kernel_logs.c.data)
            .where(
                kernel_logs.c.kernel_id == kernel_id,
                kernel_logs.c.stream == stream,
                kernel_logs.c.byte_offset + sa.func.length(kernel_logs.c.data) > offset,
            )
            .order_by(kernel_logs.c.byte_offset)
        )
        out = bytearray()
        position = offset
        for start, data in rows:
            if start > position:
                break  # a gap: a chunk still on its way; stop where the stream is known
            out += data[position - start :]
            position = start + len(data)
    return bytes(out)


async def read_outputs(db: Database, kernel_id: KernelId) -> dict[str, bytes]:
    """Every output file of the kernel, by name."""
    async with db.read() as conn:
        rows = await conn.execute(
            sa.select(kernel_outputs.c.name, kernel_outputs.c.data)
            .where(kernel_outputs.c.kernel_id == kernel_id)
            .order_by(kernel_outputs.c.name)
        )
        return {name: bytes(data) for name, data in rows}


async def _check_owner(
    conn: AsyncConnection, dialect: Dialect, agent_id: AgentId, ids: set[KernelId]
) -> None:
    rows = await conn.execute(
        sa.select(kernels.c.id, kernels.c.agent_id).where(in_values(dialect, kernels.c.id, ids))
    )
    owners = {KernelId(kid): owner for kid, owner in rows}
    refused = {kid for kid in ids if owners.get(kid) != agent_id}
    if refused:
        raise UploadRefusedError(
            f"kernel(s) {', '.join(sorted(str(k) for k in refused))} are not placed on "
            f"agent {agent_id}"
        )


def _insert_ignoring_duplicates(dialect: Dialect, table: sa.Table) -> sa.Insert:
    if dialect == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    return sqlite.insert(table).on_conflict_do_nothing()
