"""The manager daemon's coordination backends, as it opens them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from corral.coordination.manager import LoopIntervals
from corral.manager import daemon
from corral.manager.backends import Buses
from corral.manager.daemon import ManagerConfig, ManagerDaemon
from corral.store.database import Database


class _Opened(Exception):
    """Raised by the stand-in for open_buses once it has seen its arguments."""


@pytest.mark.parametrize(("long_interval_s", "ping_s"), [(120.0, 120.0), (10.0, 30.0)])
async def test_the_event_listener_pings_no_more_often_than_the_long_loop(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, long_interval_s: float, ping_s: float
) -> None:
    """An idle manager sends nothing between long loops: the event listener's keep-alive ping
    waits a long interval (never less than the default 30 s); the lock TTL is the configured one."""
    seen: dict[str, float] = {}

    @asynccontextmanager
    async def opened(
        _db: Database,
        _redis_url: str | None,
        _prefix: str,
        *,
        ping_interval_s: float,
        lock_ttl_s: float,
    ) -> AsyncIterator[Buses]:
        seen["ping_interval_s"] = ping_interval_s
        seen["lock_ttl_s"] = lock_ttl_s
        raise _Opened
        yield  # pragma: no cover

    monkeypatch.setattr(daemon, "open_buses", opened)
    intervals = LoopIntervals(short_interval_s=1.0, long_interval_s=long_interval_s)
    config = ManagerConfig(
        database_url=f"sqlite:///{tmp_path / 'corral.db'}", intervals=intervals, lock_ttl_s=2.5
    )

    with pytest.raises(_Opened):
        await ManagerDaemon(config).run()

    assert seen == {"ping_interval_s": ping_s, "lock_ttl_s": 2.5}
