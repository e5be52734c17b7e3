"""`corral simulate` stops waiting as soon as a service of its manager has stopped."""

from __future__ import annotations

import asyncio
import time

import pytest

from corral.bench._scratch import scratch_database
from corral.bench.simulate import SimulationConfig, SimulationError, _until_terminal


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
