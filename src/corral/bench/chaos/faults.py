"""Fault injection for `corral chaos`: manager kills, and Redis, PostgreSQL or agent outages.

Each injector is a coroutine that runs until cancelled and leaves what it broke working again
(a killed process started, Redis restarted, the proxy forwarding) when it ends, however it ends.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from corral.bench.chaos.processes import Manager, Supervised
from corral.testing.redis_server import RedisServer
from corral.testing.tcp_proxy import TcpProxy

logger = logging.getLogger(__name__)


class Fault(enum.StrEnum):
    """The outage injected besides the manager kills."""

    NONE = "none"
    REDIS = "redis"  # the run's own Redis killed for a window, then started (empty)
    PG = "pg"  # the managers' connections to PostgreSQL cut at a proxy for a window
    AGENT = "agent"  # one agent SIGKILLed and started again every kill interval


@dataclass
class FaultLog:
    """What was injected, when (seconds since the run's start)."""

    started: float = field(default_factory=time.monotonic)
    manager_kills: int = 0
    agent_kills: int = 0
    outages: list[tuple[float, float]] = field(default_factory=list)  # (from, to)

    def now(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.started


async def kill_managers(
    managers: Sequence[Manager], every_s: float, max_kills: int | None, log: FaultLog
) -> None:
    """SIGKILL one manager every `every_s` (in turn) and start it again at once."""
    turn = 0
    while max_kills is None or log.manager_kills < max_kills:
        await asyncio.sleep(every_s)
        victim = managers[turn % len(managers)]
        turn += 1
        victim.kill()
        log.manager_kills += 1
        logger.info("chaos.manager_killed", extra={"manager": victim.name})
        victim.start()


async def kill_agents(
    agents: Sequence[Supervised], every_s: float, max_kills: int | None, log: FaultLog
) -> None:
    """SIGKILL one agent every `every_s` (in turn) and start it again at once."""
    turn = 0
    while max_kills is None or log.agent_kills < max_kills:
        await asyncio.sleep(every_s)
        victim = agents[turn % len(agents)]
        turn += 1
        victim.kill()
        log.agent_kills += 1
        victim.start()


async def outage(
    after_s: float,
    window_s: float,
    cut: Callable[[], None],
    restore: Callable[[], object],
    log: FaultLog,
) -> None:
    """After `after_s`, `cut()` for `window_s`, then `restore()` (also if cancelled meanwhile)."""
    await asyncio.sleep(after_s)
    began = log.now()
    cut()
    try:
        await asyncio.sleep(window_s)
    finally:
        restore()
        log.outages.append((began, log.now()))


def redis_outage(
    server: RedisServer, after_s: float, window_s: float, log: FaultLog
) -> asyncio.Task[None]:
    """Kill the run's own Redis for the window, then start it again (it comes back empty)."""
    return asyncio.create_task(outage(after_s, window_s, server.kill, server.start, log))


def pg_outage(
    proxy: TcpProxy, after_s: float, window_s: float, log: FaultLog
) -> asyncio.Task[None]:
    """Cut every manager connection to PostgreSQL at the proxy for the window."""
    return asyncio.create_task(outage(after_s, window_s, proxy.cut, proxy.restore, log))
