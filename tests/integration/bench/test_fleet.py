"""`corral simulate`'s agents in a process of their own: registered, stopped, or found missing."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from corral.bench._fleet import JOIN_TOKEN, FleetFailedError, FleetSpec, ProcessFleet
from corral.controller.agents import AgentController
from corral.infra.hints import open_hint_bus
from corral.store.database import Database
from corral.store.tables import agents


@pytest.fixture
async def controller(db: Database) -> AsyncIterator[AgentController]:
    hints = await open_hint_bus("memory")
    controller = AgentController(db, hints, join_token=JOIN_TOKEN)
    polls = asyncio.create_task(controller.polls.run())
    yield controller
    polls.cancel()
    await asyncio.gather(polls, return_exceptions=True)
    await hints.close()


async def _agent_ids(db: Database) -> list[str]:
    async with db.read() as conn:
        return sorted((await conn.execute(sa.select(agents.c.id))).scalars())


async def test_the_agents_register_and_stop_when_told(
    db: Database, controller: AgentController, tmp_path: Path
) -> None:
    """start() returns once every agent of every process has registered; stop() ends them."""
    fleet = ProcessFleet(controller, FleetSpec(first=0, count=3), tmp_path, processes=2)
    await fleet.start()
    assert await _agent_ids(db) == ["sim-0000", "sim-0001", "sim-0002"]
    assert len(fleet.pids) == 2
    fleet.check()  # both still there
    report = await fleet.stop()
    assert report.sent == 0  # no sessions, nothing to report
    assert report.violations.count == 0


async def test_a_process_that_dies_is_noticed(
    db: Database, controller: AgentController, tmp_path: Path
) -> None:
    """A killed process of agents makes check() and stop() raise, instead of a silent hang."""
    fleet = ProcessFleet(controller, FleetSpec(first=0, count=1), tmp_path, processes=1)
    await fleet.start()
    os.kill(fleet.pids[0], signal.SIGKILL)
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        try:
            fleet.check()
        except FleetFailedError as exc:
            assert "exited with code -9" in str(exc)
            break
        assert asyncio.get_running_loop().time() < deadline, "the dead process went unnoticed"
        await asyncio.sleep(0.02)
    with pytest.raises(FleetFailedError, match="exited"):
        await fleet.stop()
