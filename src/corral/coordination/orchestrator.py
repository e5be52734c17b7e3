"""The orchestrator: runs a coordinator's dual loops side by side and stops them together.

Shutdown sequence (STYLE.md rule 4): signal every loop, give the runs in progress a grace period,
cancel what is left, then re-raise the crash that started it, if one did.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from types import TracebackType

from corral.coordination.loop import DualLoop

__all__ = ["Orchestrator"]

logger = logging.getLogger(__name__)

# How often a cancelled loop is cancelled again: on Python 3.11, asyncio.wait_for (inside
# redis-py and asyncpg) swallows a cancellation that lands as the awaited call completes.
_CANCEL_RETRY_S = 0.1


class Orchestrator:
    """One asyncio task per loop; a loop that crashes stops the others and run() re-raises."""

    def __init__(self, loops: Sequence[DualLoop], *, grace_period_s: float = 10.0) -> None:
        if not grace_period_s >= 0:
            raise ValueError(f"grace_period_s must be >= 0 seconds, got {grace_period_s!r}")
        names = [loop.task.name for loop in loops]
        if len(set(names)) != len(names):
            raise ValueError(f"each task may have only one loop; got task names {names}")
        self.loops = tuple(loops)
        self._grace_period_s = grace_period_s
        self._stop_requested = asyncio.Event()
        self._finished = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] | None = None  # None until run() starts them
        self._runner: asyncio.Task[None] | None = None

    async def run(self) -> None:
        """Run every loop until stop(); re-raise the exception of a loop that crashed."""
        if self._tasks is not None:
            raise RuntimeError("Orchestrator.run() was already called; make a new Orchestrator")
        self._tasks = []
        if self._stop_requested.is_set():
            self._finished.set()
            return
        self._tasks = [
            asyncio.create_task(loop.run(), name=f"loop-{loop.task.name}") for loop in self.loops
        ]
        crash: BaseException | None = None
        stop_requested = asyncio.create_task(self._stop_requested.wait(), name="orchestrator-stop")
        try:
            running: set[asyncio.Task[None]] = set(self._tasks)
            # Until stop() or a crash: a loop that returned (its own stop()) ends nothing else.
            while crash is None and not self._stop_requested.is_set():
                await asyncio.wait([*running, stop_requested], return_when=asyncio.FIRST_COMPLETED)
                for task in [task for task in running if task.done()]:
                    running.discard(task)
                    error = None if task.cancelled() else task.exception()
                    if error is not None:
                        logger.error(
                            "coordinator.loop_crashed",
                            extra={"task": task.get_name(), "error": type(error).__name__},
                            exc_info=error,
                        )
                        if crash is None:
                            crash = error
        finally:
            stop_requested.cancel()
            await self._shut_down()
            self._finished.set()
        if crash is None:
            crash = self._first_error()
        if crash is not None:
            raise crash

    async def stop(self) -> None:
        """Stop every loop (grace period, then cancellation) and wait for run() to end; idempotent.

        Does not raise a loop's crash: run() does.
        """
        self._stop_requested.set()
        if self._tasks is None:
            return  # run() has not started: it will return at once when it does
        await self._finished.wait()

    async def __aenter__(self) -> Orchestrator:
        """Run in the background until the block ends."""
        if self._runner is not None:
            raise RuntimeError("this Orchestrator is already running; make a new one")
        self._runner = asyncio.create_task(self.run(), name="orchestrator")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Stop, and re-raise a loop's crash."""
        assert self._runner is not None
        await self.stop()
        await self._runner

    async def _shut_down(self) -> None:
        assert self._tasks is not None
        for loop in self.loops:
            loop.stop()
        pending = {task for task in self._tasks if not task.done()}
        if pending:
            _, pending = await asyncio.wait(pending, timeout=self._grace_period_s)
        if pending:
            logger.warning(
                "coordinator.grace_period_expired",
                extra={
                    "tasks": sorted(task.get_name() for task in pending),
                    "grace_period_s": self._grace_period_s,
                },
            )
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=_CANCEL_RETRY_S)

    def _first_error(self) -> BaseException | None:
        """The exception of a loop that failed during the shutdown itself, if any."""
        assert self._tasks is not None
        for task in self._tasks:
            if not task.cancelled() and (error := task.exception()) is not None:
                return error
        return None
