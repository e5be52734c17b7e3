"""Kernels' logs in the store: the last lines, since a time, the size cap, re-sent chunks."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa

from corral.domain.types import AgentId, KernelId
from corral.store.database import Database
from corral.store.kernel_logs import LogChunk, append_log_chunks
from corral.store.log_reading import LogRead, read_log_from, read_log_tail
from corral.store.sessions import SessionRepository
from corral.store.tables import kernel_logs
from tests.integration.store._factories import (
    NOW,
    add_agents,
    add_session_ids,
    add_user,
    place_all,
)


async def _placed_kernel(db: Database) -> tuple[AgentId, KernelId]:
    """A kernel placed on a fresh agent, which may upload its logs."""
    owner = await add_user(db)
    (agent,) = await add_agents(db, [{"cpu": 4000}])
    (sid,) = await add_session_ids(db, owner, 1)
    await place_all(db, [sid], agent)
    (session,) = await SessionRepository(db).get([sid])
    return agent, session.kernels[0].id


def _text(read: LogRead) -> bytes:
    return b"".join(p.data for p in read.pieces)


async def _upload(
    db: Database, agent: AgentId, kernel: KernelId, parts: list[bytes], **cap: int
) -> None:
    """Upload `parts` as consecutive chunks, one upload each, a second apart."""
    offset = 0
    for i, data in enumerate(parts):
        chunk = LogChunk(kernel, "stdout", offset, data)
        await append_log_chunks(db, agent, [chunk], NOW + timedelta(seconds=i), **cap)
        offset += len(data)


async def test_the_last_lines_across_chunks(db: Database) -> None:
    """`lines=N` starts at the Nth line from the end, wherever the chunks split the lines."""
    agent, kernel = await _placed_kernel(db)
    await _upload(db, agent, kernel, [b"one\ntw", b"o\nthree\nfo", b"ur\nfive\n"])
    assert _text(await read_log_tail(db, kernel, "stdout", lines=2)) == b"four\nfive\n"
    assert _text(await read_log_tail(db, kernel, "stdout", lines=4)) == b"two\nthree\nfour\nfive\n"
    every = await read_log_tail(db, kernel, "stdout", lines=50)
    assert _text(every) == b"one\ntwo\nthree\nfour\nfive\n"
    assert (every.end, every.skipped) == (24, 0)
    assert _text(await read_log_tail(db, kernel, "stdout", lines=0)) == b""


async def test_the_last_line_without_its_newline_counts(db: Database) -> None:
    """An unfinished last line is one of the last lines."""
    agent, kernel = await _placed_kernel(db)
    await _upload(db, agent, kernel, [b"a\nb\n", b"partial"])
    assert _text(await read_log_tail(db, kernel, "stdout", lines=2)) == b"b\npartial"


async def test_since_starts_at_the_first_chunk_stored_then(db: Database) -> None:
    """`since` keeps the chunks stored at or after it; with `lines`, the last of those."""
    agent, kernel = await _placed_kernel(db)
    await _upload(db, agent, kernel, [b"early\n", b"middle\n", b"late\nlater\n"])
    since = NOW + timedelta(seconds=1)
    assert _text(await read_log_tail(db, kernel, "stdout", since=since)) == (
        b"middle\nlate\nlater\n"
    )
    assert _text(await read_log_tail(db, kernel, "stdout", since=since, lines=1)) == b"later\n"
    future = NOW + timedelta(days=1)
    assert _text(await read_log_tail(db, kernel, "stdout", since=future)) == b""


async def test_the_cap_keeps_the_newest_chunks_and_says_what_was_dropped(db: Database) -> None:
    """Past the cap, the oldest chunks go; a read from the start begins with what is kept."""
    agent, kernel = await _placed_kernel(db)
    parts = [f"{i:03}\n".encode() * 10 for i in range(5)]  # 5 chunks of 40 bytes
    await _upload(db, agent, kernel, parts, cap_bytes=100)
    read = await read_log_from(db, kernel, "stdout")
    # 200 bytes stored: kept from the chunk holding the last chunk's offset less the cap on.
    assert (read.skipped, read.end) == (40, 200)
    assert _text(read) == b"".join(parts[1:])
    tail = await read_log_tail(db, kernel, "stdout", lines=3)
    assert (_text(tail), tail.skipped) == (b"004\n" * 3, 0)
    asked_too_much = await read_log_tail(db, kernel, "stdout", lines=100)
    assert asked_too_much.skipped == 40


async def test_a_resent_chunk_is_stored_once_and_never_brings_back_dropped_bytes(
    db: Database,
) -> None:
    """Uploads are idempotent under the cap: a re-sent old or last chunk changes nothing."""
    agent, kernel = await _placed_kernel(db)
    parts = [bytes([65 + i]) * 40 for i in range(5)]
    await _upload(db, agent, kernel, parts, cap_bytes=100)
    before = await read_log_from(db, kernel, "stdout")
    for offset, data in ((0, parts[0]), (160, parts[4])):  # dropped long ago; the last one
        again = LogChunk(kernel, "stdout", offset, data)
        await append_log_chunks(db, agent, [again], NOW + timedelta(minutes=1), cap_bytes=100)
    after = await read_log_from(db, kernel, "stdout")
    assert (_text(after), after.skipped) == (_text(before), before.skipped)
    async with db.read() as conn:
        stored = await conn.scalar(
            sa.select(sa.func.count()).where(kernel_logs.c.kernel_id == kernel)
        )
    assert stored == 4


async def test_no_cap_keeps_everything(db: Database) -> None:
    """Without a cap every chunk stays and nothing is reported dropped."""
    agent, kernel = await _placed_kernel(db)
    parts = [b"x" * 40] * 5
    await _upload(db, agent, kernel, parts)
    read = await read_log_from(db, kernel, "stdout", offset=30)
    assert (len(_text(read)), read.skipped, read.end) == (170, 0, 200)
