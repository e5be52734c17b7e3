"""The PostgreSQL event bus: NOTIFY on publish, LISTEN on one dedicated asyncpg connection.

A notification carries either an event's JSON, or a notice of appended events (their ids and
kinds, `store.events.EventNotice`): what appending with the commit channel sends, and what
publish() sends for an event too large for a NOTIFY payload (the server's limit is 8,000
bytes), which must then have been appended (and committed) first. The listener reads the
events of a notice from the table only if a subscriber wants one of its kinds.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg
import sqlalchemy as sa

from corral.domain.events import Event
from corral.infra.events import PING_INTERVAL_S, EventBusError
from corral.infra.events._listener import ListeningBus
from corral.store.database import Database
from corral.store.events import (
    notification,
    send_notifications,
)

logger = logging.getLogger(__name__)

_IDENTIFIER_MAX = 63  # PostgreSQL truncates longer identifiers
_PLAIN = re.compile(r"[a-z_][a-z0-9_]*")


def channel_name(prefix: str) -> str:
    """The NOTIFY channel of `prefix`: `<prefix>_events`, made a plain identifier.

    A prefix that needs changing gets a digest of itself appended, so two prefixes never
    share a channel because they sanitise alike ("a-b" and "a_b").
    """
    plain = f"{prefix}_events"
    if _PLAIN.fullmatch(plain) and len(plain) <= _IDENTIFIER_MAX:
        return plain
    cleaned = re.sub(r"[^a-z0-9_]", "_", prefix.lower())[:40]
    digest = hashlib.sha256(prefix.encode()).hexdigest()[:10]
    return f"e_{cleaned}_{digest}_events"


@dataclass(slots=True)
class _Listener:
    connection: asyncpg.Connection
    # Payloads in arrival order; None once the connection is gone.
    inbox: asyncio.Queue[str | None]


class PostgresEventBus(ListeningBus[_Listener]):
    """Events fanned out with NOTIFY `<prefix>_events` to every manager on one database."""

    transient_errors = (
        OSError,
        TimeoutError,
        asyncpg.PostgresError,
        asyncpg.InterfaceError,
        sa.exc.DBAPIError,
    )

    def __init__(
        self,
        db: Database,
        *,
        prefix: str = "corral",
        ping_interval_s: float = PING_INTERVAL_S,
        backoff_base_s: float = 0.05,
        backoff_cap_s: float = 10.0,
    ) -> None:
        if db.dialect != "postgresql":
            raise ValueError("the postgres event bus needs a Database on PostgreSQL")
        super().__init__(prefix, backoff_base_s=backoff_base_s, backoff_cap_s=backoff_cap_s)
        self._db = db
        self.channel = channel_name(prefix)
        self._ping_interval_s = ping_interval_s
        # asyncpg wants a plain libpq-style DSN, without SQLAlchemy's driver suffix.
        self._dsn = db.url.set(drivername="postgresql").render_as_string(hide_password=False)

    @classmethod
    async def open(
        cls, db: Database, *, prefix: str = "corral", ping_interval_s: float = PING_INTERVAL_S
    ) -> PostgresEventBus:
        """A bus already listening (so it gets every event published after this returns)."""
        bus = cls(db, prefix=prefix, ping_interval_s=ping_interval_s)
        await bus._start()
        return bus

    @property
    def commit_channel(self) -> str:
        return self.channel

    async def publish(self, events: Sequence[Event]) -> None:
        self._check_open()
        if not events:
            return
        payloads = [notification(event) for event in events]
        try:
            async with self._db.autocommit() as conn:
                await send_notifications(conn, self.channel, payloads)
        except (*self.transient_errors, sa.exc.TimeoutError) as exc:
            raise EventBusError(
                f"could not publish {len(events)} events: {type(exc).__name__}: {exc}"
            ) from exc

    async def close(self) -> None:
        await self._stop_listening()

    async def _connect(self) -> _Listener:
        connection = await asyncpg.connect(
            self._dsn, server_settings={"application_name": "corral-events"}
        )
        inbox: asyncio.Queue[str | None] = asyncio.Queue()
        try:
            connection.add_termination_listener(lambda _conn: inbox.put_nowait(None))
            await connection.add_listener(
                self.channel, lambda _conn, _pid, _channel, payload: inbox.put_nowait(payload)
            )
        except BaseException:
            connection.terminate()
            raise
        return _Listener(connection, inbox)

    async def _pump(self, listener: _Listener) -> None:
        while True:
            try:
                first = await asyncio.wait_for(listener.inbox.get(), self._ping_interval_s)
            except TimeoutError:
                # A half-open TCP connection stays silent: only a query can tell it is gone.
                await asyncio.wait_for(
                    listener.connection.execute("SELECT 1"), self._ping_interval_s
                )
                continue
            batch = [first]
            while not listener.inbox.empty():
                batch.append(listener.inbox.get_nowait())
            lost = None in batch
            self._deliver(await self._decode(self._db, [p for p in batch if p is not None]))
            if lost:
                return

    async def _disconnect(self, listener: _Listener) -> None:
        try:
            await listener.connection.close(timeout=5)
        except BaseException:
            listener.connection.terminate()
            raise
