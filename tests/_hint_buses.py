"""Hint buses for tests: the in-process bus, recording what its waiters ask."""

from __future__ import annotations

from collections.abc import Collection

from corral.infra.hints.memory import MemoryHintBus


class WaitRecorder(MemoryHintBus):
    """A memory bus that records each wait's timeout; `lossless` as a test wants it."""

    def __init__(self, *, lossless: bool) -> None:
        super().__init__()
        self.lossless = lossless
        self.timeouts: list[float] = []

    async def wait(self, names: Collection[str], timeout_s: float) -> bool:
        self.timeouts.append(timeout_s)
        return await super().wait(names, timeout_s)
