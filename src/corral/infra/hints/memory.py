"""The in-process hint bus: a set of names per prefix, waiters woken directly (no polling)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from corral.infra.hints import ClaimableHintBus, HintBusError, LocalWaiters


class MemoryHintHub:
    """What in-process buses share, like a server: the set hints and the waiters per prefix."""

    def __init__(self) -> None:
        self._set: defaultdict[str, set[str]] = defaultdict(set)
        self._waiters: defaultdict[str, list[LocalWaiters]] = defaultdict(list)

    def attach(self, prefix: str, waiters: LocalWaiters) -> None:
        """Wake `waiters` whenever a hint under `prefix` is set."""
        self._waiters[prefix].append(waiters)

    def detach(self, prefix: str, waiters: LocalWaiters) -> None:
        """Stop waking `waiters`."""
        self._waiters[prefix].remove(waiters)

    def set(self, prefix: str, names: frozenset[str]) -> None:
        """Mark `names` set under `prefix` and wake every attached bus."""
        self._set[prefix].update(names)
        for waiters in self._waiters[prefix]:
            waiters.wake(names)

    def take(self, prefix: str, name: str) -> bool:
        """Clear `name` under `prefix`; True if it was set."""
        hints = self._set[prefix]
        if name in hints:
            hints.remove(name)
            return True
        return False

    def any_set(self, prefix: str, names: Iterable[str]) -> bool:
        """Whether any of `names` is set under `prefix`."""
        return not self._set[prefix].isdisjoint(names)


class MemoryHintBus(ClaimableHintBus):
    """Hints for one process; buses built on one `hub` see each other's hints."""

    lossless = True  # a set wakes the hub's waiters directly

    def __init__(self, *, prefix: str = "corral", hub: MemoryHintHub | None = None) -> None:
        super().__init__()
        self._prefix = prefix
        self._hub = hub if hub is not None else MemoryHintHub()
        self._closed = False
        self._hub.attach(prefix, self._waiters)

    async def close(self) -> None:
        """Detach from the hub and fail pending waits; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._hub.detach(self._prefix, self._waiters)
        self._waiters.fail(HintBusError("the memory hint bus is closed"))

    async def _send(self, names: list[str]) -> None:
        self._hub.set(self._prefix, frozenset(names))

    async def _take(self, name: str) -> bool:
        # The event loop makes this atomic.
        return self._hub.take(self._prefix, name)

    async def _any_set(self, names: frozenset[str]) -> bool:
        return self._hub.any_set(self._prefix, names)
