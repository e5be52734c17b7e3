"""The PostgreSQL hint bus: a set hint is a row of `hints`; NOTIFY wakes waiting managers.

An idle manager must make no database query between long loops, so the bus keeps a local set
of names that *may* be set: a notification adds its name, (re)connecting the listener makes
every name possibly set (notifications sent while nobody listened are lost), and checking a
name with a query removes it first, so a notification that arrives during the query adds it
back. Names outside that set are answered locally: consume() is False, wait() keeps waiting.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import secrets
from collections.abc import Iterable
from typing import Any

import asyncpg
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from corral.infra._backoff import reconnect_delays
from corral.infra.hints import ClaimableHintBus, HintBusError
from corral.store._direct import DirectStatement
from corral.store.database import Database
from corral.store.tables import hints

logger = logging.getLogger(__name__)

APPLICATION_NAME = "corral-hints"
RECONNECT_MIN_S = 0.1
RECONNECT_MAX_S = 10.0
CONNECT_TIMEOUT_S = 10.0
_NAME_MAX = 128  # the length of hints.name
_CONNECT_ERRORS = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)

# Setting hints is one statement (one round trip, its own transaction): upsert the rows, then
# NOTIFY each name, delivered at commit, so a woken waiter always finds the row. A notification
# says which bus sent it (`origin/name`): a bus already knows what it set itself, and acting on
# its own notification, which arrives after its loop has consumed the hint, cost a query for
# every hint set (a fifth of a PostgreSQL manager's statements at 100 submissions/s).
_SET = DirectStatement(
    lambda _dialect: sa.text(
        "WITH upserted AS ("
        " INSERT INTO hints (name, set_at)"
        " SELECT key, now() FROM unnest(CAST(:keys AS text[])) AS key"
        " ON CONFLICT (name) DO UPDATE SET set_at = excluded.set_at"
        " RETURNING name"
        ") SELECT pg_notify(:channel, CAST(:origin AS text) || n)"
        " FROM unnest(CAST(:names AS text[])) AS n"
        " WHERE (SELECT count(*) FROM upserted) > 0"
    )
)
_ORIGIN_LEN = 9  # 8 hex digits and "/"

_CONSUME = DirectStatement(
    lambda _dialect: (
        hints.delete()
        .where(hints.c.name == sa.bindparam("key", type_=sa.Text()))
        .returning(hints.c.name)
    )
)
_ANY_SET = DirectStatement(
    lambda _dialect: sa.select(hints.c.name).where(
        hints.c.name == sa.func.any(sa.bindparam("keys", type_=postgresql.ARRAY(sa.Text())))
    )
)


def channel_name(prefix: str) -> str:
    """The NOTIFY channel for `prefix`: a lower-case identifier within PostgreSQL's 63 bytes."""
    base = re.sub(r"[^a-z0-9_]", "_", prefix.lower())
    if base != prefix or len(base) > 40:
        # Sanitizing can map two prefixes to one channel; a digest of the original keeps them
        # apart (a shared channel would only cost spurious checks, never a wrong answer).
        digest = hashlib.blake2s(prefix.encode(), digest_size=4).hexdigest()
        base = f"{base[:40]}_{digest}"
    return f"{base}_hints" if base[0].isalpha() or base[0] == "_" else f"_{base}_hints"


def listener_dsn(db: Database) -> str:
    """The raw asyncpg DSN of `db` (its URL without the SQLAlchemy driver name)."""
    return db.url.set(drivername="postgresql").render_as_string(hide_password=False)


class _MaybeSet:
    """Names whose hint may be set; `everything` holds right after (re)connecting."""

    def __init__(self) -> None:
        self._everything = True
        self._names: set[str] = set()
        self._cleared: set[str] = set()  # known unset since `everything` began

    def __contains__(self, name: str) -> bool:
        return name in self._names or (self._everything and name not in self._cleared)

    def known(self, name: str) -> bool:
        """Whether a set of `name` was seen (here or notified), not merely possible."""
        return name in self._names

    def add(self, names: Iterable[str]) -> None:
        self._names.update(names)

    def discard(self, names: Iterable[str]) -> None:
        for name in names:
            self._names.discard(name)
            if self._everything:
                self._cleared.add(name)

    def everything(self) -> None:
        self._everything = True
        self._names.clear()
        self._cleared.clear()


class PostgresHintBus(ClaimableHintBus):
    """Hints in the `hints` table, woken through LISTEN on one dedicated asyncpg connection."""

    server_errors = (*_CONNECT_ERRORS, sa.exc.DBAPIError, sa.exc.TimeoutError)

    def __init__(self, db: Database, *, prefix: str = "corral") -> None:
        if db.dialect != "postgresql":
            raise ValueError(
                f"the postgres hint bus needs a PostgreSQL database, not {db.dialect}; "
                "use the memory hint bus with SQLite"
            )
        super().__init__()
        self._db = db
        self._prefix = prefix
        self._channel = channel_name(prefix)
        self._origin = f"{secrets.token_hex(4)}/"  # this bus, in the notifications it sends
        self._maybe = _MaybeSet()
        self._connection: Any = None  # the asyncpg connection holding LISTEN
        self._lost = asyncio.Event()
        self._listener_task: asyncio.Task[None] | None = None
        self._closed = False

    @classmethod
    async def open(cls, db: Database, *, prefix: str = "corral") -> PostgresHintBus:
        """Connect the listener (errors surface here) and start supervising it."""
        bus = cls(db, prefix=prefix)
        await bus._connect()
        bus._listener_task = asyncio.create_task(bus._supervise(), name=f"hints-listener:{prefix}")
        bus._listener_task.add_done_callback(bus._on_supervisor_done)
        return bus

    async def _send(self, names: list[str]) -> None:
        """Upsert the hints' rows and NOTIFY their names, in one statement."""
        keys = [self._key(name) for name in names]
        # Known before the statement: its own notification will not tell this bus (see _SET).
        self._maybe.add(names)
        params = {"keys": keys, "channel": self._channel, "names": names, "origin": self._origin}
        async with self._db.autocommit() as conn:
            await _SET.rows(conn, params)
        self._waiters.wake(names)

    async def _take(self, name: str) -> bool:
        """DELETE the hint's row; answered locally (False, no query) unless it may be set."""
        key = self._key(name)
        if name not in self._maybe:
            return False
        self._maybe.discard([name])
        try:
            async with self._db.autocommit() as conn:
                return bool(await _CONSUME.rows(conn, {"key": key}))
        except BaseException:
            self._maybe.add([name])
            raise

    async def close(self) -> None:
        """Stop the supervisor and close the listener connection; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._waiters.fail(HintBusError(f"the postgres hint bus {self._prefix!r} is closed"))
        if self._listener_task is not None:
            self._listener_task.cancel()
            await asyncio.gather(self._listener_task, return_exceptions=True)
        connection, self._connection = self._connection, None
        if connection is not None:
            try:
                await connection.close(timeout=CONNECT_TIMEOUT_S)
            except _CONNECT_ERRORS:
                connection.terminate()

    def _key(self, name: str) -> str:
        key = f"{self._prefix}:{name}"
        if len(key) > _NAME_MAX:
            raise ValueError(f"hint {key!r} is longer than {_NAME_MAX} characters; shorten it")
        return key

    async def _any_set(self, names: frozenset[str]) -> bool:
        if any(self._maybe.known(name) for name in names):
            # Seen set and not consumed here since: say so without a query. If another manager
            # consumed it meanwhile, the caller's consume() finds out (atomically) and forgets it.
            return True
        maybe = [name for name in names if name in self._maybe]
        if not maybe:
            return False
        self._maybe.discard(maybe)
        try:
            async with self._db.autocommit() as conn:
                keys = await _ANY_SET.scalars(conn, {"keys": [self._key(n) for n in maybe]})
                found = [key.removeprefix(f"{self._prefix}:") for key in keys]
        except BaseException:
            self._maybe.add(maybe)
            raise
        self._maybe.add(found)  # still set: a later consume must query it
        return bool(found)

    async def _connect(self) -> None:
        conn = await asyncpg.connect(
            listener_dsn(self._db),
            timeout=CONNECT_TIMEOUT_S,
            server_settings={"application_name": APPLICATION_NAME},
        )
        conn.add_termination_listener(self._on_terminated)
        try:
            await conn.add_listener(self._channel, self._on_notification)
        except BaseException:
            conn.terminate()
            raise
        self._connection = conn
        self._lost.clear()
        if conn.is_closed():  # died before `_on_terminated` could recognise it
            self._lost.set()
        # LISTEN is active now; anything set before it was never notified to this bus.
        self._maybe.everything()
        self._waiters.wake_all()

    async def _supervise(self) -> None:
        while True:
            await self._lost.wait()
            delays = reconnect_delays(RECONNECT_MIN_S, RECONNECT_MAX_S)
            while True:
                try:
                    await self._connect()
                    break
                except _CONNECT_ERRORS as exc:
                    delay_s = next(delays)
                    logger.warning(
                        "hints.listener_reconnect backend=postgres channel=%s error=%s "
                        "retry_in_s=%.2f",
                        self._channel,
                        type(exc).__name__,
                        delay_s,
                    )
                    await asyncio.sleep(delay_s)
            logger.info("hints.listener_reconnected backend=postgres channel=%s", self._channel)

    def _on_terminated(self, conn: Any) -> None:
        if conn is self._connection and not self._closed:
            logger.warning("hints.listener_lost backend=postgres channel=%s", self._channel)
            self._lost.set()

    def _on_notification(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        if payload.startswith(self._origin):
            return  # set by this bus, which knew it then
        name = payload[_ORIGIN_LEN:]
        self._maybe.add([name])
        self._waiters.wake([name])

    def _on_supervisor_done(self, task: asyncio.Task[None]) -> None:
        if self._closed:
            return
        error = None if task.cancelled() else task.exception()
        reason = "cancelled" if task.cancelled() else repr(error) if error else "returned"
        logger.error(
            "hints.listener_failed backend=postgres channel=%s reason=%s",
            self._channel,
            reason,
            exc_info=error,
        )
        self._waiters.fail(
            HintBusError(f"the postgres hint listener for {self._channel!r} stopped ({reason})")
        )
