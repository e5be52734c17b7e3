"""Retention: exactly the sessions ended before the cut go, with every row recorded about them."""

from __future__ import annotations

import uuid
from datetime import timedelta

import sqlalchemy as sa

from corral.domain.events import SESSION_ENTITY, Event
from corral.domain.types import AgentId, SessionId
from corral.store.database import Database
from corral.store.events import append_events
from corral.store.kernel_logs import LogChunk, OutputBlob, append_log_chunks, store_outputs
from corral.store.retention import purge_expired_sessions
from corral.store.sessions import SessionRepository
from corral.store.tables import (
    events,
    kernel_history,
    kernel_logs,
    kernel_outputs,
    kernels,
    session_history,
    sessions,
)
from tests.integration.store._factories import (
    NOW,
    add_agents,
    add_dependent,
    add_session_ids,
    add_user,
    place_all,
    update_sessions,
)

LONG_AGO = NOW - timedelta(days=40)
CUT = NOW - timedelta(days=30)


async def _with_records(db: Database, agent: AgentId, sid: SessionId) -> None:
    """Give a placed session logs, an output file and an event of its own."""
    (session,) = await SessionRepository(db).get([sid])
    kernel = session.kernels[0].id
    await append_log_chunks(db, agent, [LogChunk(kernel, "stdout", 0, b"out\n")], NOW)
    await store_outputs(db, agent, [OutputBlob(kernel, "result.txt", b"42")], NOW)
    event = Event(
        kind="session.test",
        entity_type=SESSION_ENTITY,
        entity_id=str(sid),
        payload={},
        created_at=NOW,
    )
    async with db.transaction() as conn:
        await append_events(conn, [event], NOW)


async def _rows_of(db: Database, sid: SessionId) -> dict[str, int]:
    """How many rows each table holds about the session."""
    kernel_ids = sa.select(kernels.c.id).where(kernels.c.session_id == sid)
    counts = {
        "sessions": sa.select(sa.func.count()).where(sessions.c.id == sid),
        "kernels": sa.select(sa.func.count()).where(kernels.c.session_id == sid),
        "logs": sa.select(sa.func.count()).where(kernel_logs.c.kernel_id.in_(kernel_ids)),
        "outputs": sa.select(sa.func.count()).where(kernel_outputs.c.kernel_id.in_(kernel_ids)),
        "session_history": sa.select(sa.func.count()).where(session_history.c.session_id == sid),
        "kernel_history": sa.select(sa.func.count()).where(kernel_history.c.session_id == sid),
        "events": sa.select(sa.func.count()).where(events.c.entity_id == str(sid)),
    }
    async with db.read() as conn:
        return {name: int(await conn.scalar(query) or 0) for name, query in counts.items()}


async def test_purge_deletes_exactly_the_expired_ended_sessions(db: Database) -> None:
    """Ended before the cut: gone with logs, outputs, history, events; the rest untouched."""
    owner = await add_user(db)
    (agent,) = await add_agents(db, [{"cpu": 64000}])
    expired, recent, running, waited_on = await add_session_ids(db, owner, 4)
    await place_all(db, [expired, recent, running, waited_on], agent)
    for sid in (expired, recent, running, waited_on):
        await _with_records(db, agent, sid)
    await update_sessions(db, [expired, waited_on], status="TERMINATED", terminated_at=LONG_AGO)
    await update_sessions(db, [recent], status="TERMINATED", terminated_at=NOW)
    await update_sessions(db, [running], status="RUNNING")
    dependant = await add_dependent(db, owner, [waited_on])  # PENDING, still to run
    before = {sid: await _rows_of(db, sid) for sid in (recent, running, waited_on, dependant)}
    assert all((await _rows_of(db, expired)).values())  # a row of every kind to delete

    purged = await purge_expired_sessions(db, CUT)

    assert purged == [expired]
    assert set((await _rows_of(db, expired)).values()) == {0}
    for sid, rows in before.items():
        assert await _rows_of(db, sid) == rows
    assert await purge_expired_sessions(db, CUT) == []


async def test_purge_works_in_batches(db: Database) -> None:
    """A backlog goes a batch per call, oldest or not, until none is left."""
    owner = await add_user(db)
    ids = await add_session_ids(db, owner, 5)
    await update_sessions(db, ids, status="CANCELLED", terminated_at=LONG_AGO)
    first = await purge_expired_sessions(db, CUT, batch=3)
    second = await purge_expired_sessions(db, CUT, batch=3)
    assert len(first) == 3
    assert sorted(first + second) == sorted(ids)
    async with db.read() as conn:
        left = await conn.scalar(
            sa.select(sa.func.count()).where(sessions.c.id.in_([uuid.UUID(str(i)) for i in ids]))
        )
    assert left == 0
