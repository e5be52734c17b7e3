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


class Follower:
    """A `then` that logs what it followed up and waits at gates the test opens, in turn."""

    def __init__(self, log: list[tuple[str, tuple[int, ...]]]) -> None:
        self.log = log
        self.gates: list[asyncio.Event] = []
        self.fail_on: int | None = None

    async def then(self, results: Sequence[int]) -> None:
        self.log.append(("then", tuple(results)))
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        if self.fail_on in results:
            raise RuntimeError("the follow-up failed")


async def test_the_next_batch_is_applied_while_the_last_one_is_followed_up() -> None:
    """Batch 1 applied, its follow-up in progress: batch 2 is applied meanwhile, and batch
    1's caller gets its result only when its follow-up is done."""
    r = Recorder()
    f = Follower(r.log)
    commit = GroupCommit(r.apply, then=f.then)
    r.gate(1).set()
    r.gate(2).set()
    first = asyncio.ensure_future(commit.submit(1))
    await until(lambda: ("then", (10,)) in r.log)
    second = asyncio.ensure_future(commit.submit(2))
    await until(lambda: ("apply", (2,)) in r.log)
    await until(lambda: len(f.gates) == 1)
    assert not first.done()
    f.gates[0].set()
    assert await first == 10
    await until(lambda: len(f.gates) == 2)
    f.gates[1].set()
    assert await second == 20
    assert r.log == [("apply", (1,)), ("then", (10,)), ("apply", (2,)), ("then", (20,))]


async def test_batches_applied_during_a_follow_up_are_followed_up_together() -> None:
    """One follow-up at a time, in order: what was applied while it ran goes in the next."""
    r = Recorder()
    f = Follower(r.log)
    commit = GroupCommit(r.apply, then=f.then)
    for first in (1, 2, 3):
        r.gate(first).set()
    calls = [asyncio.ensure_future(commit.submit(1))]
    await until(lambda: len(f.gates) == 1)
    calls.append(asyncio.ensure_future(commit.submit(2)))
    await until(lambda: ("apply", (2,)) in r.log)
    calls.append(asyncio.ensure_future(commit.submit(3)))
    await until(lambda: ("apply", (3,)) in r.log)
    f.gates[0].set()
    await until(lambda: len(f.gates) == 2)
    f.gates[1].set()
    assert await asyncio.gather(*calls) == [10, 20, 30]
    assert [entry for entry in r.log if entry[0] == "then"] == [("then", (10,)), ("then", (20, 30))]


async def test_refused_items_skip_the_follow_up_and_a_failed_one_fails_its_callers() -> None:
    r = Recorder()
    f = Follower(r.log)
    f.fail_on = 40
    commit = GroupCommit(r.apply, then=f.then)
    r.gate(4).set()
    good, bad = asyncio.ensure_future(commit.submit(4)), asyncio.ensure_future(commit.submit(-5))
    with pytest.raises(ValueError, match="bad -5"):
        await bad  # at once: its follow-up gate is still closed
    await until(lambda: len(f.gates) == 1)
    assert r.log[-1] == ("then", (40,))
    f.gates[0].set()
    with pytest.raises(RuntimeError, match="follow-up failed"):
        await good
