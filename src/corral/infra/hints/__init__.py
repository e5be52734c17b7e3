"""Hints: named flags that wake coordinator loops early.

A hint only shortens latency. Every loop still runs on its long interval, so a lost hint costs
time, never correctness (DESIGN.md, "Coordination"). Three buses keep one contract: `memory`
(one process), `postgres` (a `hints` row plus LISTEN/NOTIFY) and `redis` (a key plus PUBLISH).
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import TYPE_CHECKING, Literal, TypeVar

from corral.infra._outage import OutageLog

if TYPE_CHECKING:
    from corral.store.database import Database

__all__ = [
    "ClaimableHintBus",
    "HintBus",
    "HintBusError",
    "HintBusKind",
    "LocalWaiters",
    "check_names",
    "open_hint_bus",
]

logger = logging.getLogger(__name__)

HintBusKind = Literal["memory", "postgres", "redis"]

_T = TypeVar("_T")


class HintBusError(RuntimeError):
    """The hint bus cannot serve the call: it was closed, its listener died, or its server
    could not be reached."""


class HintBus(ABC):
    """Named hints shared by the managers of one cluster: set, consume once, wait for any."""

    # Failures of set_after_commit, logged once per outage (made on first use).
    _after_commit: OutageLog | None = None
    # Whether every hint set wakes this bus's waiters, none lost on the way (an in-process bus).
    # A server's notifications can be lost (a pub/sub message during a reconnect): a dual loop
    # then looks at the server every short interval; on a lossless bus an idle loop sleeps
    # until it has something to do.
    lossless = False

    @abstractmethod
    async def set(self, *names: str) -> None:
        """Mark hints as set and wake every waiter, in this process and others.

        Raises HintBusError when the bus is closed or its server cannot be reached.
        """

    async def set_after_commit(self, *names: str) -> bool:
        """`set` the hints of a change already committed; a failure is logged, not raised.

        The change stands whether its hints go out or not: a lost hint costs latency (the
        long loop finds the work), while raising would fail a request, or a coordinator run,
        whose change was made. Returns whether the hints were set. The first failure of an
        outage is a warning, the first success after it an info line.
        """
        outage = self._after_commit
        if outage is None:
            outage = self._after_commit = OutageLog(
                logger, "hints.set_failed", "hints.set_restored"
            )
        try:
            await self.set(*names)
        except HintBusError as exc:
            outage.failure({"hints": sorted(names), "error": str(exc)})
            return False
        outage.success()
        return True

    @abstractmethod
    async def consume(self, name: str) -> bool:
        """Atomically get-and-clear: of concurrent consumers of one set hint, exactly one wins.

        This holds for consumers in other processes too; the winner gets True.
        """

    @abstractmethod
    async def wait(self, names: Collection[str], timeout_s: float) -> bool:
        """True as soon as any of `names` is set (already set counts), False on timeout.

        Never clears a hint. Raises HintBusError when the bus is closed, its listener died,
        or its server cannot be reached.
        """

    @abstractmethod
    async def close(self) -> None:
        """Release connections and make pending and later calls raise HintBusError; idempotent."""

    def claim(self, name: str) -> None:  # noqa: B027 (an optional hook: empty by default)
        """This process alone runs `name`'s task until `release(name)`: it holds the task's lock.

        A bus may then keep hints set here for `name` in this process (`ClaimableHintBus`).
        By default nothing changes.
        """

    async def release(self, name: str) -> None:  # noqa: B027 (an optional hook)
        """End a `claim`; a hint kept under it and not consumed is sent on, never lost."""


class ClaimableHintBus(HintBus):
    """A bus that keeps the hints of claimed tasks in this process.

    A manager holding a task's lock claims the task's hint. Until it releases the claim, a hint
    set in this process for that task wakes the local waiter and is consumed locally, without
    reaching the server: no other manager could run the task meanwhile (it would find the lock
    busy and leave the hint to the holder), so sending it would only cost a round trip to set it
    and one to consume it, at every hop of every session. Hints set by other managers still
    arrive through the server. Subclasses send, take and look up hints on their server.
    """

    # What the server's client raises when the server cannot be reached or answer; a call
    # failing so raises HintBusError, the one error every caller of a bus handles.
    server_errors: tuple[type[BaseException], ...] = ()

    def __init__(self) -> None:
        self._waiters = LocalWaiters()
        self._claimed: set[str] = set()
        self._kept: set[str] = set()  # claimed hints set here and not consumed yet

    async def set(self, *names: str) -> None:
        """Mark hints as set and wake every waiter; a claimed hint stays in this process."""
        self._waiters.raise_if_failed()
        checked = check_names(names)
        kept = checked.intersection(self._claimed)
        if kept:
            self._kept.update(kept)
            self._waiters.wake(kept)
            checked = checked.difference(kept)
        if checked:
            # Sorted: one row-lock order on a server, so concurrent sets never deadlock.
            await self._on_server(self._send(sorted(checked)), "set hints")

    async def consume(self, name: str) -> bool:
        """Atomically get-and-clear (a kept hint locally, else on the server)."""
        self._waiters.raise_if_failed()
        check_names([name])
        if name in self._kept:
            # The claimant's run serves anything set on the server meanwhile too; a hint left
            # there costs at most one more run after it.
            self._kept.discard(name)
            return True
        return await self._on_server(self._take(name), "consume a hint")

    async def wait(self, names: Collection[str], timeout_s: float) -> bool:
        """True as soon as any of `names` is set, False on timeout; never clears."""
        return await self._waiters.wait(names, timeout_s, self._kept_or_set)

    def claim(self, name: str) -> None:
        """Keep hints set here for `name` in this process until `release(name)`."""
        check_names([name])
        self._claimed.add(name)

    async def release(self, name: str) -> None:
        """Stop keeping `name`'s hints; one kept and not consumed is sent to the server now."""
        self._claimed.discard(name)
        if name in self._kept:
            self._kept.discard(name)
            await self.set(name)

    @abstractmethod
    async def _send(self, names: list[str]) -> None:
        """Set `names` (sorted, not empty) on the server and wake this process's waiters."""

    @abstractmethod
    async def _take(self, name: str) -> bool:
        """Get-and-clear `name` on the server, atomically across processes."""

    @abstractmethod
    async def _any_set(self, names: frozenset[str]) -> bool:
        """Whether any of `names` is set on the server."""

    async def _kept_or_set(self, names: frozenset[str]) -> bool:
        if not self._kept.isdisjoint(names):
            return True
        return await self._on_server(self._any_set(names), "look hints up")

    async def _on_server(self, call: Awaitable[_T], what: str) -> _T:
        """`call`'s result; a server error raised as HintBusError."""
        try:
            return await call
        except self.server_errors as exc:
            raise HintBusError(
                f"the hint bus could not {what}: {type(exc).__name__}: {exc}"
            ) from exc


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
