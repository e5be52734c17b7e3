"""The in-process event bus: one process, every subscriber of this bus object."""

from __future__ import annotations

from collections.abc import Sequence

from corral.domain.events import Event
from corral.infra.events import FanOutBus


class MemoryEventBus(FanOutBus):
    """Fans events out to this object's subscribers, in the publisher's call."""

    async def publish(self, events: Sequence[Event]) -> None:
        self._check_open()
        self._deliver(events)

    async def close(self) -> None:
        self._end_subscriptions()
