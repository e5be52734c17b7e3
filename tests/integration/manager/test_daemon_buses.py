"""The manager daemon's coordination backends, as it opens them."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from corral.coordination.manager import LoopIntervals
from corral.manager import daemon
from corral.manager.backends import Buses
from corral.manager.daemon import ManagerConfig, ManagerDaemon
from corral.store.database import Database
from corral.testing.redis_server import free_port

DEADLINE_S = 10.0


async def eventually(predicate: Callable[[], bool], what: str) -> None:
    """Return once `predicate()` is true; fail naming `what` after DEADLINE_S."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not predicate():
        assert loop.time() < deadline, f"not within {DEADLINE_S} s: {what}"
        await asyncio.sleep(0.02)


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


@pytest.mark.redis
async def test_a_manager_restarted_on_its_address_frees_the_locks_its_killed_predecessor_held(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """A manager SIGKILLed while it held a task's lock, restarted on the same address: the lock
    is freed as it starts and the task runs at once, where before every manager waited out the
    lock's TTL. A lock another manager holds is left alone. The planted locks have no TTL, so
    only the takeover can free them."""
    port = free_port()
    sweep_key = f"{namespace}:lock:{namespace}:{daemon.SWEEP_TASK}"
    others_key = f"{namespace}:lock:{namespace}:SomeoneElsesTask"
    client = aioredis.from_url(redis_url)
    try:
        await client.set(sweep_key, f"{socket.gethostname()}:{port}/killed-predecessor")
        await client.set(others_key, f"{socket.gethostname()}:{free_port()}/alive-elsewhere")
        config = ManagerConfig(
            database_url=f"sqlite:///{tmp_path / 'corral.db'}",
            redis_url=redis_url,
            port=port,
            prefix=namespace,
            intervals=LoopIntervals(short_interval_s=0.1, long_interval_s=60.0),
            lock_ttl_s=30.0,
        )
        manager = ManagerDaemon(config)
        runner = await manager.start()
        try:
            assert manager.parts is not None
            sweep = next(
                loop
                for loop in manager.parts.orchestrator.loops
                if loop.task.name == daemon.SWEEP_TASK
            )
            await eventually(lambda: sweep.runs >= 1, "the sweep ran although its lock was left")
            assert await client.get(others_key) is not None
        finally:
            await manager.stop()
            await asyncio.wait_for(runner, DEADLINE_S)
        assert await client.get(sweep_key) is None  # released on a clean stop
    finally:
        await client.delete(sweep_key, others_key)
        await client.aclose()


@pytest.mark.redis
def test_corral_manager_frees_its_predecessors_locks_before_loading_the_rest(
    redis_url: str, namespace: str
) -> None:
    """`corral manager` frees a killed predecessor's locks first thing, before the seconds of
    imports and start-up (under a manager killed every 5 s those seconds were most of a lock's
    TTL): when the port can be bound. While something still listens there, nothing is freed."""
    import redis

    from corral.cli.manager import _free_predecessor_locks

    port = free_port()
    key = f"{namespace}:lock:{namespace}:SomeTask"
    client = redis.Redis.from_url(redis_url)
    try:
        client.set(key, f"{socket.gethostname()}:{port}/killed-predecessor")
        with socket.socket() as alive:
            alive.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            alive.bind(("127.0.0.1", port))
            alive.listen()
            _free_predecessor_locks(redis_url, "127.0.0.1", port, 5.0, namespace)
            assert client.get(key) is not None  # its holder may still be alive
        _free_predecessor_locks(redis_url, "127.0.0.1", port, 5.0, namespace)
        assert client.get(key) is None
    finally:
        client.delete(key)
        client.close()
