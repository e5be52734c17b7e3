"""Waiting in integration tests: poll with a deadline, never sleep for an outcome."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

import pytest

DEADLINE_S = 10.0


async def eventually(
    predicate: Callable[[], bool | Awaitable[bool]], what: str, deadline_s: float = DEADLINE_S
) -> None:
    """Poll `predicate` (plain or async) until it holds; fail after `deadline_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    while True:
        outcome = predicate()
        if await outcome if inspect.isawaitable(outcome) else outcome:
            return
        if loop.time() > deadline:
            pytest.fail(f"not within {deadline_s} s: {what}")
        await asyncio.sleep(0.01)
