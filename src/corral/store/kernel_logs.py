"""Kernels' logs and outputs, as agents upload them, and reading them back.

Log chunks are keyed by (kernel, stream, byte offset): an agent that re-sends chunks after a
lost reply writes nothing twice, and reading a stream is the chunks in offset order
(`log_reading.py`). Only the agent a kernel is placed on may upload for it.

A stream keeps its newest `cap_bytes` (at least, in whole chunks): each upload drops the chunks
that lie before the stream's end less the cap. That is one statement per stream of the upload,
reading offsets from the key's index and deleting a range of it, never a scan of the stream.
A re-sent chunk from before the cut is stored and dropped again in the same transaction, so
what a reader sees never goes back.
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

DEFAULT_LOG_CAP_BYTES = 10 * 1024 * 1024  # per kernel and stream (a manager setting)


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
    db: Database,
    agent_id: AgentId,
    chunks: Sequence[LogChunk],
    now: datetime,
    *,
    cap_bytes: int | None = None,
) -> None:
    """Store the chunks (all or none), keeping each stream's newest `cap_bytes` (None: all).

    Chunks already stored are left as they are.
    """
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
        if cap_bytes is not None:
            streams = dict.fromkeys((c.kernel_id, c.stream) for c in chunks)
            await conn.execute(
                _DROP_BEFORE_CAP,
                [{"kernel_id": k, "stream": s, "cap_bytes": cap_bytes} for k, s in streams],
            )


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


def _drop_before_cap() -> sa.Delete:
    """Delete a stream's chunks before the one holding its last chunk's offset less the cap.

    Offsets only, never the chunks' lengths: both look-ups are read from the key's index alone
    (a blob's length can cost a read of its pages on SQLite). What is kept runs from that
    chunk to the end, at least the cap and at most the cap plus two chunks. Built once, with
    the stream and the cap as parameters.
    """
    c = kernel_logs.c
    kernel_id = sa.bindparam("kernel_id", type_=c.kernel_id.type)
    stream = sa.bindparam("stream", type_=c.stream.type)
    last = (
        sa.select(sa.func.max(c.byte_offset))
        .where(c.kernel_id == kernel_id, c.stream == stream)
        .scalar_subquery()
    )
    kept = kernel_logs.alias("kept")
    holder = (
        sa.select(sa.func.max(kept.c.byte_offset))
        .where(
            kept.c.kernel_id == kernel_id,
            kept.c.stream == stream,
            kept.c.byte_offset <= last - sa.bindparam("cap_bytes", type_=sa.BigInteger()),
        )
        .scalar_subquery()
    )
    return kernel_logs.delete().where(
        c.kernel_id == kernel_id, c.stream == stream, c.byte_offset < holder
    )


_DROP_BEFORE_CAP = _drop_before_cap()


def _insert_ignoring_duplicates(dialect: Dialect, table: sa.Table) -> sa.Insert:
    if dialect == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    return sqlite.insert(table).on_conflict_do_nothing()
