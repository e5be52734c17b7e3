"""`corral simulate` stops waiting as soon as a service of its manager, or its agents'
process, has stopped."""

from __future__ import annotations

import asyncio
import time

import pytest

from corral.bench._scratch import scratch_database
from corral.bench.agent_host import JOIN_TOKEN
from corral.bench.simulate import AgentsProcess, SimulationConfig, SimulationError, _until_terminal
from corral.controller.agents import AgentController
from corral.infra.hints.memory import MemoryHintBus
from corral.store.database import Database


async def test_a_stopped_manager_loop_ends_the_wait_with_its_error() -> None:
    """Sessions cannot end without the coordinator's loops: the run fails at once, naming the
    service and its error, instead of waiting out its timeout."""

    async def crash() -> None:
        raise RuntimeError("the hint server went away")

    loops = asyncio.create_task(crash(), name="sim-orchestrator")
    await asyncio.wait([loops])
    config = SimulationConfig(sessions=10, timeout_s=600.0)
    async with scratch_database("sqlite") as db:
        with pytest.raises(
            SimulationError, match="sim-orchestrator stopped: RuntimeError: the hint server"
        ):
            await _until_terminal(db, config, time.perf_counter(), lambda _: None, [loops])


async def test_agents_whose_process_dies_end_the_wait_with_its_exit_code(db: Database) -> None:
    """The simulated agents run in a process of their own: killed, the run fails at once,
    saying how that process ended, rather than waiting out its timeout."""
    controller = AgentController(db, MemoryHintBus(), join_token=JOIN_TOKEN)
    watcher = asyncio.create_task(controller.polls.run())
    agents = AgentsProcess(controller)
    config = SimulationConfig(agents=2, sessions=10, timeout_s=600.0)
    try:
        await agents.start(config)
        assert agents.process is not None
        agents.process.kill()
        with pytest.raises(
            SimulationError, match=r"sim-agents stopped: RuntimeError: .*exited with code -9"
        ):
            await _until_terminal(db, config, time.perf_counter(), lambda _: None, [agents.watcher])
    finally:
        done = await agents.stop()
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
    assert done == {}  # it never said what it counted
