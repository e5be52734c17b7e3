"""Reading a kernel's log back: all of it, its last lines, what came after a time or an offset.

A stream is stored as chunks keyed by byte offset (`kernel_logs.py`). An agent uploads a
stream's chunks in order, so a stream's first stored chunk starts at 0 unless the size cap
dropped what came before it: the offset of the first stored chunk is how many bytes were
dropped. Every read here touches only the chunks it returns (plus index look-ups): the last
10 lines of a 10 MiB log read the last chunk or two, never the whole stream.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.log_text import LogPiece
from corral.domain.record import record
from corral.domain.types import KernelId
from corral.store.database import Database
from corral.store.tables import kernel_logs

_c = kernel_logs.c
# Chunks read per query while walking a stream backwards for its last lines: the last chunk
# alone first (a few lines are in it), then more at a time.
TAIL_BATCHES = (1, 8)


@record
class LogRead:
    """Contiguous pieces of one stream, and where the stream stands."""

    pieces: list[LogPiece]
    end: int  # the offset after the last byte read (where a follower continues)
    # Bytes the size cap dropped that the reader asked for (the read begins where the kept
    # part of the stream does): the note shown in their place says how many.
    skipped: int


async def read_log_from(db: Database, kernel_id: KernelId, stream: str, offset: int = 0) -> LogRead:
    """The stream from `offset` on (from its first kept byte, if the cap dropped `offset`)."""
    async with db.read() as conn:
        dropped = await _first_offset(conn, kernel_id, stream)
        return await _forward(conn, kernel_id, stream, max(offset, dropped), dropped - offset)


async def read_log(db: Database, kernel_id: KernelId, stream: str, offset: int = 0) -> bytes:
    """The stream's bytes from `offset` on, as far as they are contiguous (what is kept)."""
    read = await read_log_from(db, kernel_id, stream, offset)
    return b"".join(piece.data for piece in read.pieces)


async def read_log_tail(
    db: Database,
    kernel_id: KernelId,
    stream: str,
    *,
    lines: int | None = None,
    since: datetime | None = None,
) -> LogRead:
    """The stream's last `lines` lines, of those stored at or after `since` (None: no limit)."""
    async with db.read() as conn:
        dropped = await _first_offset(conn, kernel_id, stream)
        start = dropped
        if since is not None:
            start = max(start, await _first_since(conn, kernel_id, stream, since))
        if lines is not None:
            start = max(start, await _tail_start(conn, kernel_id, stream, lines))
        # Lines wanted from before the kept part: the note stands for what was dropped.
        return await _forward(conn, kernel_id, stream, start, dropped if start == dropped else 0)


async def _first_offset(conn: AsyncConnection, kernel_id: KernelId, stream: str) -> int:
    first = await conn.scalar(
        sa.select(_c.byte_offset)
        .where(_c.kernel_id == kernel_id, _c.stream == stream)
        .order_by(_c.byte_offset)
        .limit(1)
    )
    return int(first or 0)


async def _first_since(
    conn: AsyncConnection, kernel_id: KernelId, stream: str, since: datetime
) -> int:
    """The offset of the first chunk stored at or after `since` (past the end: none was)."""
    found = await conn.scalar(
        sa.select(_c.byte_offset)
        .where(_c.kernel_id == kernel_id, _c.stream == stream, _c.created_at >= since)
        .order_by(_c.created_at, _c.byte_offset)
        .limit(1)
    )
    if found is not None:
        return int(found)
    return await _end(conn, kernel_id, stream)


async def _end(conn: AsyncConnection, kernel_id: KernelId, stream: str) -> int:
    last = (
        await conn.execute(
            sa.select(_c.byte_offset, sa.func.length(_c.data))
            .where(_c.kernel_id == kernel_id, _c.stream == stream)
            .order_by(_c.byte_offset.desc())
            .limit(1)
        )
    ).first()
    return 0 if last is None else int(last[0]) + int(last[1])


async def _tail_start(conn: AsyncConnection, kernel_id: KernelId, stream: str, lines: int) -> int:
    """The offset where the stream's last `lines` lines begin, walking back chunk by chunk.

    A final line without its newline counts as a line. Walking back stops at a gap (bytes
    not stored): what lies before it cannot be shown contiguously with what follows.
    """
    if lines <= 0:
        return await _end(conn, kernel_id, stream)
    newlines_needed = lines  # the newline before the first line shown, or the stream's start
    before: int | None = None  # walk chunks below this offset
    expected_end: int | None = None  # the next (later) chunk's offset, to notice a gap
    start = 0
    first = True
    batch = TAIL_BATCHES[0]
    while True:
        query = (
            sa.select(_c.byte_offset, _c.data)
            .where(_c.kernel_id == kernel_id, _c.stream == stream)
            .order_by(_c.byte_offset.desc())
            .limit(batch)
        )
        batch = TAIL_BATCHES[-1]
        if before is not None:
            query = query.where(_c.byte_offset < before)
        rows: list[Any] = list(await conn.execute(query))
        if not rows:
            return start
        for row_offset, row_data in rows:
            offset, data = int(row_offset), bytes(row_data)
            if expected_end is not None and offset + len(data) != expected_end:
                return start  # a gap: show only what follows it
            if first and data.endswith(b"\n"):
                data = data[:-1]  # the final newline ends the last line, it starts none
            first = False
            position = len(data)
            while newlines_needed > 0:
                position = data.rfind(b"\n", 0, position)
                if position < 0:
                    break
                newlines_needed -= 1
                if newlines_needed == 0:
                    return offset + position + 1
            start = offset
            expected_end = offset
        before = int(rows[-1][0])


async def _forward(
    conn: AsyncConnection, kernel_id: KernelId, stream: str, start: int, skipped: int
) -> LogRead:
    """The contiguous bytes from `start` on, as pieces (the chunk holding `start` cut)."""
    floor = await conn.scalar(
        sa.select(_c.byte_offset)
        .where(_c.kernel_id == kernel_id, _c.stream == stream, _c.byte_offset <= start)
        .order_by(_c.byte_offset.desc())
        .limit(1)
    )
    rows = await conn.execute(
        sa.select(_c.byte_offset, _c.created_at, _c.data)
        .where(
            _c.kernel_id == kernel_id,
            _c.stream == stream,
            _c.byte_offset >= (floor if floor is not None else start),
        )
        .order_by(_c.byte_offset)
    )
    pieces: list[LogPiece] = []
    position = start
    for offset, created_at, data in rows:
        end = offset + len(data)
        if end <= position:
            continue
        if offset > position:
            break  # a gap: a chunk still on its way; stop where the stream is known
        pieces.append(LogPiece(position, created_at, bytes(data[position - offset :])))
        position = end
    return LogRead(pieces, position, max(0, skipped))
