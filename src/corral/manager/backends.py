"""Opening a manager's hint bus, lock manager and event bus from its configuration."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from corral.domain.record import record
from corral.infra.events import PING_INTERVAL_S, EventBus, EventBusKind, open_event_bus
from corral.infra.hints import HintBus, open_hint_bus
from corral.infra.locks import DEFAULT_LOCK_TTL_S, LockManager, open_lock_manager
from corral.store.database import Database


@record
class Buses:
    """The three coordination backends a manager uses."""

    kind: EventBusKind
    hints: HintBus
    locks: LockManager
    events: EventBus


def bus_kind(db: Database, redis_url: str | None) -> EventBusKind:
    """Redis with a Redis URL; else PostgreSQL's own on PostgreSQL; else in-process (SQLite)."""
    if redis_url:
        return "redis"
    if db.dialect == "postgresql":
        return "postgres"
    return "memory"


@asynccontextmanager
async def open_buses(
    db: Database,
    redis_url: str | None,
    prefix: str,
    *,
    ping_interval_s: float = PING_INTERVAL_S,
    lock_ttl_s: float = DEFAULT_LOCK_TTL_S,
) -> AsyncIterator[Buses]:
    """Open hints, locks and events of one kind (see `bus_kind`); close them on exit.

    `ping_interval_s`: how often the event listener pings a silent connection (see
    `open_event_bus`); `lock_ttl_s`: the task locks' TTL and call deadline (`open_lock_manager`).
    """
    kind = bus_kind(db, redis_url)
    dsn = db.url.render_as_string(hide_password=False)
    async with AsyncExitStack() as stack:
        hints = await open_hint_bus(kind, prefix=prefix, db=db, redis_url=redis_url)
        stack.push_async_callback(hints.close)
        locks = await open_lock_manager(
            kind,
            prefix=prefix,
            postgres_dsn=dsn if kind == "postgres" else None,
            redis_url=redis_url,
            ttl_s=lock_ttl_s,
        )
        stack.push_async_callback(locks.close)
        events = await open_event_bus(
            kind, prefix=prefix, db=db, redis_url=redis_url, ping_interval_s=ping_interval_s
        )
        stack.push_async_callback(events.close)
        yield Buses(kind, hints, locks, events)
