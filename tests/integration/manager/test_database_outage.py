"""A manager survives its database (issue 32, defect 3): PostgreSQL reached through a proxy the
test cuts and restores; the server itself is never touched."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from corral.controller._assignment_polls import AssignmentPolls
from corral.controller.agents import AgentController, AgentTimings
from corral.coordination.hints import Hint
from corral.coordination.manager import LoopIntervals
from corral.infra.hints.memory import MemoryHintBus
from corral.manager.daemon import ManagerConfig, ManagerDaemon
from corral.store.assignments import read_revisions
from corral.store.database import Database
from corral.store.tables import agents
from corral.store.unavailable import database_unavailable
from corral.testing.tcp_proxy import TcpProxy
from tests.conftest import through_proxy
from tests.integration._polling import eventually
from tests.integration.coordination._harness import Clock
from tests.integration.store._factories import add_agents

pytestmark = pytest.mark.postgres

RECHECK_S = 0.05
WAIT_S = 600.0  # a poll's own deadline: far beyond the test's
DEADLINE_S = 10.0


@pytest.fixture
async def direct_db(postgres_database_url: str) -> AsyncIterator[Database]:
    """The test database, reached directly."""
    db = Database.open(postgres_database_url, pool_size=2)
    try:
        yield db
    finally:
        await db.close()


@pytest.fixture
async def proxied_db(
    postgres_database_url: str, postgres_proxy: TcpProxy
) -> AsyncIterator[Database]:
    """The same database, reached through the cuttable proxy."""
    db = Database.open(through_proxy(postgres_database_url, postgres_proxy), pool_size=2)
    try:
        yield db
    finally:
        postgres_proxy.restore()
        await db.close()


async def test_the_assignment_polls_wait_out_a_dropped_database_connection(
    direct_db: Database,
    proxied_db: Database,
    postgres_proxy: TcpProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A batch that fails on a dropped connection ends nothing: the poll server logs the outage
    once, keeps trying, and answers the parked poll once the database is back (it used to end
    with the error, and the manager with it)."""
    caplog.set_level(logging.INFO, logger="corral.controller._assignment_polls")
    [agent_id] = await add_agents(direct_db, [{"cpu": 4000}])
    [revision] = (await read_revisions(direct_db, [agent_id])).values()
    hints = MemoryHintBus()
    polls = AssignmentPolls(proxied_db, hints, RECHECK_S)
    server = asyncio.create_task(polls.run())
    try:
        poll = asyncio.create_task(polls.get(agent_id, revision, WAIT_S))
        await eventually(lambda: polls.waiting(agent_id) == 1, "the poll is parked")
        postgres_proxy.cut()
        async with direct_db.transaction() as conn:  # not behind the proxy
            await conn.execute(
                agents.update()
                .where(agents.c.id == agent_id)
                .values(assignment_revision=agents.c.assignment_revision + 1)
            )
        await hints.set(Hint.ASSIGNMENTS.value)
        await eventually(
            lambda: "agent.assignment_polls_database_unavailable" in caplog.messages,
            "the outage is noticed",
        )
        await asyncio.sleep(0)  # let a crash, if any, end the task
        assert not server.done(), server
        postgres_proxy.restore()
        assignment = await asyncio.wait_for(poll, DEADLINE_S)
    finally:
        polls.close()
        await asyncio.wait_for(server, DEADLINE_S)
        await hints.close()
    assert assignment.revision == revision + 1
    assert caplog.messages.count("agent.assignment_polls_database_unavailable") == 1
    assert "agent.assignment_polls_resumed" in caplog.messages


async def test_a_manager_survives_its_database_and_says_so_in_readyz(
    postgres_database_url: str, postgres_proxy: TcpProxy, tmp_path: Path
) -> None:
    """The manager's connections cut: it keeps running, /readyz answers 503 naming the
    database while cut and 200 again soon after the connections are restored."""
    manager = ManagerDaemon(outage_config(postgres_database_url, postgres_proxy, tmp_path))
    runner = await manager.start()
    try:
        async with httpx.AsyncClient(base_url=manager.url, timeout=DEADLINE_S) as http:
            assert (await http.get("/readyz")).status_code == 200
            postgres_proxy.cut()

            async def not_ready() -> bool:
                response = await http.get("/readyz")
                return response.status_code == 503 and "database" in response.text

            await eventually(not_ready, "/readyz says the database is unavailable")
            assert manager.parts is not None
            loops = manager.parts.orchestrator.loops
            await eventually(
                lambda: sum(loop.failures for loop in loops) >= 2 * len(loops),
                "every loop met the outage",
            )
            assert not runner.done(), runner
            postgres_proxy.restore()

            async def ready() -> bool:
                return (await http.get("/readyz")).status_code == 200

            await eventually(ready, "/readyz is ready again")
        assert not runner.done()
    finally:
        postgres_proxy.restore()
        await manager.stop()
        await asyncio.wait_for(runner, 30)


async def test_a_manager_started_during_a_database_outage_comes_up_when_it_ends(
    postgres_database_url: str,
    postgres_proxy: TcpProxy,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Started with its database cut off, the manager waits instead of ending (a supervisor
    restarting it met the same outage each time), says so once, and listens and is ready
    soon after the database is back."""
    caplog.set_level(logging.INFO, logger="corral.manager.daemon")
    postgres_proxy.cut()
    manager = ManagerDaemon(outage_config(postgres_database_url, postgres_proxy, tmp_path))
    starting = asyncio.create_task(manager.start())
    runner: asyncio.Task[None] | None = None
    try:
        await eventually(
            lambda: "manager.waiting_for_servers" in caplog.messages, "the wait is logged"
        )
        assert not starting.done()
        postgres_proxy.restore()
        runner = await asyncio.wait_for(starting, DEADLINE_S)
        async with httpx.AsyncClient(base_url=manager.url, timeout=DEADLINE_S) as http:
            assert (await http.get("/readyz")).status_code == 200
        assert caplog.messages.count("manager.waiting_for_servers") == 1
        assert "manager.servers_reachable" in caplog.messages
    finally:
        postgres_proxy.restore()
        await manager.stop()
        await asyncio.wait_for(runner or starting, 30)


async def test_a_manager_on_a_sqlite_file_it_cannot_open_fails_at_once(tmp_path: Path) -> None:
    """A SQLite file's error is no outage to wait for: the start fails, saying why."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    config = ManagerConfig(database_url=f"sqlite:///{blocker / 'corral.db'}", port=0)
    with pytest.raises(OSError, match="not-a-directory"):
        await asyncio.wait_for(ManagerDaemon(config).start(), DEADLINE_S)


async def test_no_agent_is_lost_for_the_silence_of_a_database_outage(
    direct_db: Database, proxied_db: Database, postgres_proxy: TcpProxy
) -> None:
    """After a lost sweep failed on the database, agents get a full heartbeat timeout from
    its return before any is declared LOST (their heartbeats failed meanwhile); then a silent
    one is."""
    [agent_id] = await add_agents(direct_db, [{"cpu": 1000}])  # last heard from at NOW
    clock = Clock()
    agents_controller = sweeping_controller(proxied_db, clock)
    clock.advance(60)  # silent for twice the timeout, as through a long outage
    postgres_proxy.cut()
    with pytest.raises(Exception) as failed:
        await agents_controller.sweep_lost()
    assert database_unavailable(failed.value)
    postgres_proxy.restore()
    assert (await agents_controller.sweep_lost()).agent_ids == []
    clock.advance(29.9)
    assert (await agents_controller.sweep_lost()).agent_ids == []
    clock.advance(0.2)
    assert (await agents_controller.sweep_lost()).agent_ids == [agent_id]


async def test_the_sweep_comes_due_at_the_end_of_the_grace_after_an_outage(
    direct_db: Database, proxied_db: Database, postgres_proxy: TcpProxy
) -> None:
    """The sweep's own read failing on the database starts the grace as a failed lost sweep
    does: its due moment is held to the grace's end, and only then is a silent agent LOST."""
    [agent_id] = await add_agents(direct_db, [{"cpu": 1000}])  # last heard from at NOW
    clock = Clock()
    agents_controller = sweeping_controller(proxied_db, clock)
    clock.advance(60)
    postgres_proxy.cut()
    with pytest.raises(Exception) as failed:
        await agents_controller.sweep()
    assert database_unavailable(failed.value)
    postgres_proxy.restore()
    swept = await agents_controller.sweep()
    assert swept.lost.agent_ids == []
    assert swept.due_in_s == pytest.approx(30.0)
    clock.advance(29.9)
    swept = await agents_controller.sweep()
    assert swept.lost.agent_ids == []
    assert swept.due_in_s == pytest.approx(0.1)
    clock.advance(0.2)
    assert (await agents_controller.sweep()).lost.agent_ids == [agent_id]


def sweeping_controller(db: Database, clock: Clock) -> AgentController:
    """The agent controller whose sweeps the outage tests run: a 30 s heartbeat timeout."""
    return AgentController(
        db,
        MemoryHintBus(),
        join_token=None,
        timings=AgentTimings(heartbeat_timeout_s=30.0),
        clock=clock,
    )


def outage_config(database_url: str, proxy: TcpProxy, tmp_path: Path) -> ManagerConfig:
    """A manager on the test database through `proxy`, with short loops."""
    return ManagerConfig(
        database_url=through_proxy(database_url, proxy),
        port=0,
        join_token="outage-test",
        prefix=f"outage-{tmp_path.name[-8:]}",
        intervals=LoopIntervals(short_interval_s=0.1, long_interval_s=1.0),
        grace_period_s=2,
        lock_ttl_s=1.0,
    )
