"""Page data shared between dashboards: one read for the requests of a key within the TTL,
also while it runs; the page says the event id read before the shared read; failures are not
kept; the clock is injected."""

from __future__ import annotations

import asyncio

import pytest

from corral.web.shared import SharedReads


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_requests_within_the_ttl_share_one_read_and_its_event_id() -> None:
    """Two requests while the read runs and one after it ended, within a second: one read;
    the later ones render after the event id the first read was started at."""
    clock, calls, gate = Clock(), [], asyncio.Event()
    reads = SharedReads(ttl_s=1.0, clock=clock)

    async def compute() -> str:
        calls.append(1)
        await gate.wait()
        return "page data"

    first = asyncio.create_task(reads.read("queue", 7, compute))
    second = asyncio.create_task(reads.read("queue", 9, compute))
    await asyncio.sleep(0)
    gate.set()
    assert await first == ("page data", 7)
    assert await second == ("page data", 7)
    clock.now += 0.9
    assert await reads.read("queue", 12, compute) == ("page data", 7)
    assert len(calls) == 1
    clock.now += 0.2  # past the TTL of the first read's start: read again
    assert await reads.read("queue", 15, compute) == ("page data", 15)
    assert len(calls) == 2


async def test_keys_are_read_apart() -> None:
    """Another page, or another viewer's scope of the same page, is its own read."""
    reads = SharedReads(clock=Clock())

    async def value(text: str) -> str:
        return text

    assert await reads.read(("queue", None), 1, lambda: value("all")) == ("all", 1)
    assert await reads.read(("queue", "alice"), 2, lambda: value("alice's")) == ("alice's", 2)
    assert await reads.read(("queue", None), 3, lambda: value("again")) == ("all", 1)


async def test_a_failed_read_fails_its_waiters_and_is_read_again() -> None:
    """The requests waiting for a read that fails get its error; the next one reads anew."""
    reads = SharedReads(clock=Clock())
    gate = asyncio.Event()

    async def broken() -> str:
        await gate.wait()
        raise RuntimeError("the database went away")

    async def fine() -> str:
        return "page data"

    waiting = [asyncio.create_task(reads.read("agents", 1, broken)) for _ in range(2)]
    await asyncio.sleep(0)
    gate.set()
    for task in waiting:
        with pytest.raises(RuntimeError, match="went away"):
            await task
    assert await reads.read("agents", 2, fine) == ("page data", 2)


async def test_a_request_that_goes_away_leaves_the_read_to_the_others() -> None:
    """The first requester's browser closes (its request is cancelled): the others still get
    the read's value."""
    reads = SharedReads(clock=Clock())
    gate = asyncio.Event()

    async def compute() -> str:
        await gate.wait()
        return "page data"

    first = asyncio.create_task(reads.read("overview", 1, compute))
    second = asyncio.create_task(reads.read("overview", 2, compute))
    await asyncio.sleep(0)
    first.cancel()
    gate.set()
    assert await second == ("page data", 1)


async def test_a_refresh_is_not_given_a_read_from_before_the_event_it_refreshes_for() -> None:
    """A read started at event 10 is shared with a page that saw up to event 10, not with one
    that saw event 11 (its change could be missing): that one reads, and its read is shared
    from then on."""
    reads = SharedReads(clock=Clock())
    calls: list[int] = []

    async def compute() -> int:
        calls.append(1)
        return len(calls)

    assert await reads.read("queue", 10, compute) == (1, 10)
    assert await reads.read("queue", 11, compute, seen=10) == (1, 10)
    assert await reads.read("queue", 11, compute, seen=11) == (2, 11)
    assert await reads.read("queue", 12, compute, seen=11) == (2, 11)
