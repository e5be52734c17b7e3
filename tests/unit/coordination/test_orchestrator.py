"""The orchestrator: loops run side by side, stop together, and a crash is never silent."""

from __future__ import annotations

import asyncio
import logging

import pytest

from corral.coordination.loop import DualLoop
from corral.coordination.orchestrator import Orchestrator
from corral.coordination.tasks import Task, TaskRun
from corral.infra.hints.memory import MemoryHintBus
from corral.infra.locks.memory import MemoryLockManager
from tests.unit.coordination.test_loop import NEVER_S, eventually


class Boom(BaseException):
    """Not an Exception: a loop that meets it dies."""


class Handler:
    """A task's run: counts calls; `boom` crashes the loop, `hang` never returns."""

    def __init__(self, name: str, *, boom: bool = False, hang: bool = False) -> None:
        self.name = name
        self.boom = boom
        self.hang = hang
        self.calls = 0
        self.started = asyncio.Event()
        self.cancelled = False

    async def __call__(self) -> TaskRun:
        self.calls += 1
        self.started.set()
        if self.boom:
            raise Boom(self.name)
        if self.hang:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        return TaskRun(task=self.name)


def make_loops(hints: MemoryHintBus, *handlers: Handler) -> list[DualLoop]:
    """One idle loop per handler (hour-long intervals, no run at start): only hints make them
    run."""
    locks = MemoryLockManager()
    return [
        DualLoop(
            Task(name=handler.name, hint=handler.name, run=handler, lock=handler.name),
            hints,
            locks,
            short_interval_s=NEVER_S,
            long_interval_s=NEVER_S,
            run_at_start=False,
        )
        for handler in handlers
    ]


async def test_every_loop_runs_until_stop() -> None:
    """Each loop answers its own hint; stop() ends them all without the grace period."""
    hints = MemoryHintBus()
    schedule, terminate = Handler("schedule"), Handler("terminate")
    loops = make_loops(hints, schedule, terminate)
    orchestrator = Orchestrator(loops, grace_period_s=NEVER_S)
    run = asyncio.create_task(orchestrator.run())
    await hints.set("schedule", "terminate")
    await eventually(lambda: all(loop.runs == 1 for loop in loops))
    await asyncio.wait_for(orchestrator.stop(), 5)
    assert run.done()
    await run
    assert not any(loop.running for loop in loops)


async def test_a_crashing_loop_stops_the_others_and_run_reraises(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A loop that dies takes the orchestrator down loudly: others stopped, the error raised."""
    hints = MemoryHintBus()
    crashing, healthy = Handler("schedule", boom=True), Handler("terminate")
    loops = make_loops(hints, crashing, healthy)
    orchestrator = Orchestrator(loops, grace_period_s=NEVER_S)
    run = asyncio.create_task(orchestrator.run())
    await eventually(lambda: all(loop.running for loop in loops))
    with caplog.at_level(logging.ERROR, logger="corral.coordination.orchestrator"):
        await hints.set("schedule")
        with pytest.raises(Boom, match="schedule"):
            await asyncio.wait_for(run, 5)
    assert not any(loop.running for loop in loops)
    assert "coordinator.loop_crashed" in caplog.messages
    await orchestrator.stop()  # after the crash: returns at once, raises nothing


async def test_stop_cancels_a_run_still_going_after_the_grace_period(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A run that outlives the grace period is cancelled, and stop() still returns."""
    hints = MemoryHintBus()
    hanging = Handler("schedule", hang=True)
    orchestrator = Orchestrator(make_loops(hints, hanging), grace_period_s=0.05)
    run = asyncio.create_task(orchestrator.run())
    await hints.set("schedule")
    await hanging.started.wait()
    with caplog.at_level(logging.WARNING, logger="corral.coordination.orchestrator"):
        await asyncio.wait_for(orchestrator.stop(), 5)
    assert hanging.cancelled
    assert "coordinator.grace_period_expired" in caplog.messages
    await run


async def test_stop_before_run_makes_run_return_at_once() -> None:
    """An orchestrator stopped before it started never starts its loops."""
    handler = Handler("schedule")
    hints = MemoryHintBus()
    await hints.set("schedule")
    loops = make_loops(hints, handler)
    orchestrator = Orchestrator(loops)
    await orchestrator.stop()
    await asyncio.wait_for(orchestrator.run(), 5)
    assert handler.calls == 0
    assert not loops[0].running


async def test_stop_twice_and_concurrently_is_harmless() -> None:
    """Concurrent and repeated stop() calls all return once the loops have ended."""
    orchestrator = Orchestrator(make_loops(MemoryHintBus(), Handler("schedule")))
    run = asyncio.create_task(orchestrator.run())
    await eventually(lambda: orchestrator.loops[0].running)
    await asyncio.wait_for(asyncio.gather(orchestrator.stop(), orchestrator.stop()), 5)
    await orchestrator.stop()
    await run


async def test_the_context_manager_runs_in_the_background_and_reraises_a_crash() -> None:
    """`async with` runs the loops during the block; a crash surfaces when the block ends."""
    hints = MemoryHintBus()
    crashing = Handler("schedule", boom=True)
    loops = make_loops(hints, crashing)
    with pytest.raises(Boom):
        async with Orchestrator(loops):
            await eventually(lambda: loops[0].running)
            await hints.set("schedule")
            await eventually(lambda: not loops[0].running)
    assert crashing.calls == 1


async def test_run_twice_is_an_error() -> None:
    """An orchestrator runs once; a second run() is refused."""
    orchestrator = Orchestrator(make_loops(MemoryHintBus(), Handler("schedule")))
    async with orchestrator:
        await eventually(lambda: orchestrator.loops[0].running)
        with pytest.raises(RuntimeError, match="already called"):
            await orchestrator.run()


def test_two_loops_for_one_task_are_refused() -> None:
    """Each task gets one loop, so its name is unambiguous in logs and metrics."""
    loops = make_loops(MemoryHintBus(), Handler("schedule"), Handler("schedule"))
    with pytest.raises(ValueError, match="only one loop"):
        Orchestrator(loops)
