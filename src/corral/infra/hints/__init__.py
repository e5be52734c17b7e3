"""Hints: named flags that wake coordinator loops early.

A hint only shortens latency. Every loop still runs on its long interval, so a lost hint costs
time, never correctness (DESIGN.md, "Coordination"). Three buses keep one contract: `memory`
(one process), `postgres` (a `hints` row plus LISTEN/NOTIFY) and `redis` (a key plus PUBLISH).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from corral.store.database import Database

__all__ = [
    "HintBus",
    "HintBusError",
    "HintBusKind",
    "LocalWaiters",
    "check_names",
    "open_hint_bus",
]

HintBusKind = Literal["memory", "postgres", "redis"]


class HintBusError(RuntimeError):
    """The hint bus cannot serve the call: it was closed, or its listener died."""


class HintBus(ABC):
    """Named hints shared by the managers of one cluster: set, consume once, wait for any."""

    @abstractmethod
    async def set(self, *names: str) -> None:
        """Mark hints as set and wake every waiter, in this process and others."""

    @abstractmethod
    async def consume(self, name: str) -> bool:
        """Atomically get-and-clear: of concurrent consumers of one set hint, exactly one wins.

        This holds for consumers in other processes too; the winner gets True.
        """

    @abstractmethod
    async def wait(self, names: Collection[str], timeout_s: float) -> bool:
        """True as soon as any of `names` is set (already set counts), False on timeout.

        Never clears a hint. Raises HintBusError when the bus is closed or its listener died.
        """

    @abstractmethod
    async def close(self) -> None:
        """Release connections and make pending and later calls raise HintBusError; idempotent."""


def check_names(names: Iterable[str]) -> frozenset[str]:
    """`names` as a set, or an error for a bare string (a common slip) or an empty name."""
    if isinstance(names, str):
        raise TypeError(f"hint names must be a collection, e.g. [{names!r}], not a string")
    checked = frozenset(names)
    if any(not isinstance(name, str) or not name for name in checked):
        raise ValueError(f"hint names must be non-empty strings, got {sorted(map(repr, checked))}")
    return checked


class _Waiter:
    __slots__ = ("event", "hit", "names")

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.event = asyncio.Event()
        self.hit = False  # a hint in `names` was reported set


class LocalWaiters:
    """The waiters of one bus in this process; the bus's listener wakes them."""

    def __init__(self) -> None:
        self._waiters: set[_Waiter] = set()
        self._error: HintBusError | None = None

    def wake(self, names: Iterable[str]) -> None:
        """Wake the waiters for any of `names`: those hints were just set."""
        names = frozenset(names)
        for waiter in self._waiters:
            if not waiter.names.isdisjoint(names):
                waiter.hit = True
                waiter.event.set()

    def wake_all(self) -> None:
        """Make every waiter check again: hints may have been set while nobody listened."""
        for waiter in self._waiters:
            waiter.event.set()

    def fail(self, error: HintBusError) -> None:
        """Make every current and later call raise `error` (the first failure is kept)."""
        if self._error is None:
            self._error = error
        self.wake_all()

    def raise_if_failed(self) -> None:
        """Raise the bus's failure, if any."""
        if self._error is not None:
            raise self._error

    async def wait(
        self,
        names: Collection[str],
        timeout_s: float,
        any_set: Callable[[frozenset[str]], Awaitable[bool]],
    ) -> bool:
        """True once a wake names one of `names` or `any_set(names)` says so; False at the deadline.

        `any_set` runs first, then after every `wake_all`.
        """
        wanted = check_names(names)
        self.raise_if_failed()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_s, 0.0)
        waiter = _Waiter(wanted)
        # Registered before the first check: a hint set after the check wakes this waiter, so no
        # set can slip between "checked, not set" and "waiting".
        self._waiters.add(waiter)
        waiter.event.set()
        try:
            while True:
                try:
                    async with asyncio.timeout_at(deadline):
                        await waiter.event.wait()
                except TimeoutError:
                    return False
                waiter.event.clear()
                self.raise_if_failed()
                if waiter.hit or await any_set(wanted):
                    return True
        finally:
            self._waiters.discard(waiter)


async def open_hint_bus(
    kind: HintBusKind,
    *,
    prefix: str = "corral",
    db: Database | None = None,
    redis_url: str | None = None,
) -> HintBus:
    """Open the hint bus of `kind`; keys, channels and rows are namespaced by `prefix`."""
    if not prefix:
        raise ValueError("the hint bus prefix must be a non-empty string, e.g. 'corral'")
    if kind == "memory":
        from corral.infra.hints.memory import MemoryHintBus

        return MemoryHintBus(prefix=prefix)
    if kind == "postgres":
        if db is None:
            raise ValueError(
                "the postgres hint bus needs db=<a Database on PostgreSQL>; "
                "use kind='memory' for a single process"
            )
        from corral.infra.hints.postgres import PostgresHintBus

        return await PostgresHintBus.open(db, prefix=prefix)
    if kind == "redis":
        if not redis_url:
            raise ValueError("the redis hint bus needs redis_url, e.g. redis://127.0.0.1:6379/0")
        from corral.infra.hints.redis import RedisHintBus

        return await RedisHintBus.open(redis_url, prefix=prefix)
    raise ValueError(f"unknown hint bus kind {kind!r}; use 'memory', 'postgres' or 'redis'")
