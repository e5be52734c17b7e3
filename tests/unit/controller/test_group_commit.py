"""GroupCommit: calls during a batch form the next one; results and errors per caller."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from corral.controller._group_commit import GroupCommit


class Recorder:
    """An `apply` that logs its batches and waits at gates the test opens."""

    def __init__(self) -> None:
        self.log: list[tuple[str, tuple[int, ...]]] = []
        self.apply_gates: dict[int, asyncio.Event] = {}  # by the batch's first item

    def gate(self, first: int) -> asyncio.Event:
        """The gate of the batch that starts with `first`."""
        return self.apply_gates.setdefault(first, asyncio.Event())

    async def apply(self, items: Sequence[int]) -> list[int | BaseException]:
        self.log.append(("apply", tuple(items)))
        await self.gate(items[0]).wait()
        if -1 in items:
            raise RuntimeError("the whole batch failed")
        return [ValueError(f"bad {i}") if i < 0 else i * 10 for i in items]


async def until(condition: Callable[[], bool], *, rounds: int = 1_000) -> None:
    """Let the loop run until `condition()` holds (no clock involved)."""
    for _ in range(rounds):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def test_calls_during_a_batch_form_the_next_one_and_each_gets_its_own_result() -> None:
    r = Recorder()
    commit = GroupCommit(r.apply)
    first = asyncio.ensure_future(commit.submit(1))
    await until(lambda: r.log == [("apply", (1,))])
    rest = [asyncio.ensure_future(commit.submit(i)) for i in (2, -3, 4)]
    await asyncio.sleep(0)
    r.gate(1).set()
    r.gate(2).set()
    assert await first == 10
    assert await rest[0] == 20
    with pytest.raises(ValueError, match="bad -3"):
        await rest[1]  # an error in its place reaches that caller only
    assert await rest[2] == 40
    assert r.log == [("apply", (1,)), ("apply", (2, -3, 4))]


async def test_a_batch_that_fails_fails_its_callers_and_the_next_batch_goes_on() -> None:
    r = Recorder()
    commit = GroupCommit(r.apply)
    doomed = asyncio.ensure_future(commit.submit(-1))
    await until(lambda: len(r.log) == 1)
    later = asyncio.ensure_future(commit.submit(5))
    await asyncio.sleep(0)
    r.gate(-1).set()
    r.gate(5).set()
    with pytest.raises(RuntimeError, match="whole batch"):
        await doomed
    assert await later == 50
