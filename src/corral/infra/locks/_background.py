"""Lock operations that must run to the end even when their caller is cancelled."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

logger = logging.getLogger("corral.infra.locks")

_T = TypeVar("_T")


async def run_to_completion(
    coro: Coroutine[Any, Any, _T],
    *,
    tasks: set[asyncio.Task[Any]],
    undo: Callable[[_T], Coroutine[Any, Any, None]] | None = None,
) -> _T:
    """Run `coro` so the caller's cancellation cannot stop it halfway.

    A cancelled caller gets CancelledError at once, but `coro` still finishes in the background
    and then `undo(result)` runs: a lock taken for a caller that is gone must be given back, or it
    would be held until the connection or TTL dies. Background work is kept in `tasks` so the
    manager's close() can wait for it.
    """
    task = _track(asyncio.ensure_future(coro), tasks)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(lambda finished: _after_abandoned(finished, undo, tasks))
        raise


def _after_abandoned(
    finished: asyncio.Future[_T],
    undo: Callable[[_T], Coroutine[Any, Any, None]] | None,
    tasks: set[asyncio.Task[Any]],
) -> None:
    if finished.cancelled():
        return
    error = finished.exception()
    if error is not None:
        # Nobody is left to see it: the caller that wanted the result was cancelled.
        logger.warning("locks.abandoned_failed", exc_info=error)
        return
    if undo is not None:
        undo_task = _track(asyncio.ensure_future(undo(finished.result())), tasks)
        undo_task.add_done_callback(_log_failure)


def _log_failure(finished: asyncio.Future[None]) -> None:
    if not finished.cancelled() and (error := finished.exception()) is not None:
        logger.warning("locks.undo_failed", exc_info=error)


def _track(task: asyncio.Task[_T], tasks: set[asyncio.Task[Any]]) -> asyncio.Task[_T]:
    tasks.add(task)
    task.add_done_callback(tasks.discard)
    return task


async def wait_for_tasks(tasks: set[asyncio.Task[Any]]) -> None:
    """Wait for the background work of run_to_completion, including undo work it spawns."""
    while tasks:
        await asyncio.wait(set(tasks))
