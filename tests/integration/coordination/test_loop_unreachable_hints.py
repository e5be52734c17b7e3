"""The dual loop on a Redis hint bus whose server cannot be reached."""

from __future__ import annotations

import asyncio
import logging

import pytest

from corral.coordination.loop import DualLoop
from corral.coordination.tasks import Task, TaskRun
from corral.infra._redis import redis_client
from corral.infra.hints.redis import RedisHintBus
from corral.infra.locks.memory import MemoryLockManager
from tests.conftest import UNREACHABLE_REDIS_URL
from tests.integration._polling import eventually

DEADLINE_S = 5.0


async def test_an_unreachable_hint_server_leaves_the_long_loop_running(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A refused connection is "a hint may be lost" for the loop, as a closed bus is: the task
    runs every short tick, the forced runs go on, and the outage is logged once. (The loop
    used to die on the client's own error.)"""
    now = [0.0]
    runs: list[int] = []

    async def run() -> TaskRun:
        runs.append(1)
        return TaskRun(task="schedule", targets=0, changed=0)

    hints = RedisHintBus(redis_client(UNREACHABLE_REDIS_URL))
    loop = DualLoop(
        Task(name="schedule", hint="schedule", run=run, lock="schedule-lock"),
        hints,
        MemoryLockManager(),
        short_interval_s=0.01,
        long_interval_s=60,
        run_at_start=False,  # the forced runs counted are the long loop's
        clock=lambda: now[0],
    )
    running = asyncio.create_task(loop.run())
    try:
        with caplog.at_level(logging.WARNING, logger="corral.coordination.loop"):
            await eventually(lambda: len(runs) >= 3, "three short ticks' runs")
            assert loop.forced_runs == 0
            now[0] = 60  # the long loop comes due
            await eventually(lambda: loop.forced_runs == 1, "the forced run")
        assert not running.done()
    finally:
        loop.stop()
        await asyncio.wait_for(running, DEADLINE_S)
        await hints.close()
    assert loop.forced_runs == 1
    assert caplog.messages.count("coordinator.hints_unavailable") == 1
