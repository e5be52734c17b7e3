"""Writers of many agent rows lock them in id order on PostgreSQL, so they cannot deadlock."""

from __future__ import annotations

import asyncio
import time

import pytest
import sqlalchemy as sa

from corral.domain.types import AgentId
from corral.store.agent_registry import record_heartbeats
from corral.store.agents import NewAgent, insert_agents
from corral.store.assignments import bump_revisions
from corral.store.database import Database
from corral.store.tables import agents
from tests.integration.store._factories import NOW

FIRST, SECOND = AgentId("agent-lock-a"), AgentId("agent-lock-b")


async def blocked_on_a_row_lock(db: Database, deadline_s: float = 10.0) -> None:
    """Return once some backend of this database waits for a lock (poll with a deadline)."""
    until = time.monotonic() + deadline_s
    while time.monotonic() < until:
        async with db.read_statements() as conn:
            waiting = await conn.scalar(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            )
        if waiting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("no backend ever waited for the row lock")


async def bump(db: Database, ids: list[AgentId]) -> None:
    async with db.transaction() as conn:
        await bump_revisions(conn, db.dialect, ids)


@pytest.mark.parametrize("write", ["heartbeats", "revisions"])
async def test_a_batch_takes_agent_locks_in_id_order(
    two_writers: tuple[Database, Database], write: str
) -> None:
    """The later agent is stored first, so a plan that locks rows as it meets them would take
    it first. With the first agent's row held elsewhere, the batch must wait on that one
    without holding the second: another writer can still lock the second at once."""
    holder, writer = two_writers
    await insert_agents(holder, [NewAgent(SECOND, "10.0.0.2:6001", {"cpu": 1000})], NOW)
    await insert_agents(holder, [NewAgent(FIRST, "10.0.0.1:6001", {"cpu": 1000})], NOW)
    batch = [SECOND, FIRST]
    async with holder.engine.connect() as held:
        await held.begin()
        await held.execute(sa.select(agents.c.id).where(agents.c.id == FIRST).with_for_update())
        if write == "heartbeats":
            task = asyncio.create_task(record_heartbeats(writer, batch, NOW))
        else:
            task = asyncio.create_task(bump(writer, batch))
        await blocked_on_a_row_lock(holder)
        async with holder.engine.connect() as probe:
            await probe.begin()
            free = await probe.execute(
                sa.select(agents.c.id).where(agents.c.id == SECOND).with_for_update(nowait=True)
            )
            assert free.scalars().all() == [SECOND]
            await probe.rollback()
        await held.rollback()
    await asyncio.wait_for(task, 10)
