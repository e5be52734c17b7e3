"""Assignment long-polls when the hint bus is down, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio

import pytest

from corral.controller._assignment_polls import LOSSLESS_RECHECK_S, AssignmentPolls
from corral.coordination.hints import Hint
from corral.domain.types import AgentId
from corral.infra._redis import redis_client
from corral.infra.hints.memory import MemoryHintBus
from corral.infra.hints.redis import RedisHintBus
from corral.store.assignments import read_revisions
from corral.store.database import Database
from corral.store.tables import agents
from tests._hint_buses import WaitRecorder
from tests.conftest import UNREACHABLE_REDIS_URL
from tests.integration._polling import eventually
from tests.integration.store._factories import add_agents

RECHECK_S = 0.05  # the interval under test, not a pause to wait for something
WAIT_S = 600.0  # a poll's own deadline: far beyond the test's
DEADLINE_S = 10.0


async def test_with_the_hint_bus_down_a_changed_assignment_comes_at_the_next_recheck(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    """No hint can say the revision moved: the polls are compared every recheck instead, and
    the outage is logged once (the listener used to die on the bus's first error, leaving
    every poll to its deadline)."""
    [agent_id] = await add_agents(db, [{"cpu": 4000}])
    [revision] = (await read_revisions(db, [agent_id])).values()
    hints = RedisHintBus(redis_client(UNREACHABLE_REDIS_URL))
    polls = AssignmentPolls(db, hints, RECHECK_S)
    server = asyncio.create_task(polls.run())
    try:
        poll = asyncio.create_task(polls.get(agent_id, revision, WAIT_S))
        await eventually(lambda: polls.waiting(agent_id) == 1, "the poll is parked")
        await polls.serve()  # compared once, at the old revision: parked until told again
        assert not poll.done()
        async with db.transaction() as conn:
            await conn.execute(
                agents.update()
                .where(agents.c.id == agent_id)
                .values(assignment_revision=agents.c.assignment_revision + 1)
            )
        assignment = await asyncio.wait_for(poll, DEADLINE_S)
    finally:
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
        await hints.close()
    assert assignment.revision == revision + 1
    assert caplog.messages.count("agent.assignment_hints_unavailable") == 1


async def test_a_bug_in_a_batch_still_ends_the_poll_server(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only database outages are waited out: any other error ends run() with that error, so
    the manager stops loudly instead of serving nothing."""
    polls = AssignmentPolls(db, MemoryHintBus(), RECHECK_S)

    async def broken() -> None:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(polls, "serve", broken)
    poll = asyncio.create_task(polls.get(AgentId("agent-1"), None, WAIT_S))  # wakes the server
    try:
        with pytest.raises(ZeroDivisionError):
            await asyncio.wait_for(polls.run(), DEADLINE_S)
    finally:
        polls.close()
        await asyncio.gather(poll, return_exceptions=True)


@pytest.mark.parametrize(
    ("lossless", "recheck_s"), [(True, LOSSLESS_RECHECK_S), (False, RECHECK_S)]
)
async def test_on_a_lossless_bus_an_idle_server_rechecks_only_at_the_long_interval(
    db: Database, lossless: bool, recheck_s: float
) -> None:
    """A bus that loses no hint wakes the server for every change, so the recheck is only a
    safety net (an idle `corral up` read the revisions every 2 s); a bus whose notifications
    can be lost keeps the short recheck. Either way a hinted change is answered at once."""
    [agent_id] = await add_agents(db, [{"cpu": 4000}])
    [revision] = (await read_revisions(db, [agent_id])).values()
    hints = WaitRecorder(lossless=lossless)
    polls = AssignmentPolls(db, hints, RECHECK_S)
    server = asyncio.create_task(polls.run())
    try:
        poll = asyncio.create_task(polls.get(agent_id, revision, WAIT_S))
        await eventually(lambda: bool(hints.timeouts), "the listener waits for a hint")
        assert set(hints.timeouts) == {recheck_s}
        async with db.transaction() as conn:
            await conn.execute(
                agents.update()
                .where(agents.c.id == agent_id)
                .values(assignment_revision=agents.c.assignment_revision + 1)
            )
        await hints.set(Hint.ASSIGNMENTS.value)
        assignment = await asyncio.wait_for(poll, DEADLINE_S)
    finally:
        polls.close()
        server.cancel()
        await asyncio.gather(server, return_exceptions=True)
    assert assignment.revision == revision + 1
