"""The database handle: one async engine on SQLite or PostgreSQL, chosen by the URL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, Literal, cast

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.util import greenlet_spawn

from corral.store import _inline_sqlite as inline_sqlite
from corral.store import _json as json_text
from corral.store.planner_stats import PlannerStatistics

Dialect = Literal["sqlite", "postgresql"]


def loads_or_text(text: str) -> Any:
    """A stored JSON value; the text itself if it does not parse. SQLite keeps JSON as text,
    and text written by hand or by a bug would fail every read of the rows around it (a
    scheduling pass, a listing, an agent's assignments); as a string where an object belongs
    it is one row the readers isolate (`coordination.quarantine`). PostgreSQL refuses it."""
    try:
        return json.loads(text)
    except ValueError:
        return text


_WRITE_OPTION = "corral_write"
_PG_READ_OPTIONS: dict[str, Any] = {
    "isolation_level": "REPEATABLE READ",
    "postgresql_readonly": True,
}
SQLITE_BUSY_TIMEOUT_MS = 30_000
# Pages of 8 KiB instead of SQLite's 4 KiB, for the databases corral creates (a database's page
# size is fixed when its first table is made; an existing one keeps its own). The indexes that
# take an entry at every step of every session (history and events, by session id) hold twice
# the entries a page, so a batch dirties fewer pages and a commit appends fewer to the WAL
# (measured with random session ids, before they were ordered by time; a 20,000-session
# `corral simulate`: medians 4 and 9 % faster in two interleaved comparisons, 3 and 6 % less
# CPU; benchmarks.md, session 16).
SQLITE_PAGE_SIZE = 8192
# The WAL is copied back into the database file (a checkpoint, at a commit) once it holds this
# many bytes (SQLite's own default is 1,000 pages, 4 MiB at 4 KiB). Every commit appends each
# page it changed, and the hot pages (the indexes of sessions, kernels, history and events)
# change in nearly every commit, so a checkpoint copies each of them once however often it
# changed since the last: a 20,000-session `corral simulate` made 82 checkpoints at 1,000
# pages and 13 at 20,000, with 67,000 fewer page writes, and ran 5-15 % faster. At 160 MiB it
# makes one: its commits took 0.44-0.49 s in all against 0.72-0.74 s at 40 MiB, and ran 4 %
# faster, for one pause of 160-190 ms where 40 MiB made several of 70-110 ms (benchmarks.md,
# session 19). The WAL file grows to about this size on disk.
SQLITE_WAL_CHECKPOINT_BYTES = 160 * 1024 * 1024
PREPARED_STATEMENTS = 1_000  # per PostgreSQL connection


class DatabaseURLError(ValueError):
    """A database URL corral cannot use."""


def async_url(url: str | sa.URL) -> sa.URL:
    """Turn a user's `sqlite:///path` or `postgresql://...` URL into its async-driver form."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise DatabaseURLError(
            f"database URL {str(url)!r} is not a URL; use sqlite:///path/to/corral.db "
            "or postgresql://user@host:5432/dbname"
        ) from exc
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise DatabaseURLError(
                "an in-memory SQLite database cannot be shared between connections; "
                "use a file: sqlite:///path/to/corral.db"
            )
        return parsed.set(drivername="sqlite+aiosqlite")
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+asyncpg")
    raise DatabaseURLError(
        f"database URL scheme {parsed.drivername!r} is not supported; "
        "use sqlite:///path or postgresql://user@host:port/db"
    )


class Database:
    """An async engine plus the transaction discipline corral needs on both backends.

    On SQLite, write transactions start with BEGIN IMMEDIATE: a deferred transaction that reads
    and then writes can fail with SQLITE_BUSY when another writer committed in between, and the
    busy timeout does not help there. Read transactions stay deferred, so WAL readers never wait.

    SQLite has one writer at a time, and a writer that finds the file locked sleeps in SQLite's
    busy handler (1 to 100 ms steps) instead of waking when the lock frees; so this process's
    writers also queue on an asyncio lock and take turns at once (halves the latency of a busy
    manager). Other processes still meet the busy handler.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        name = engine.dialect.name
        if name not in ("sqlite", "postgresql"):
            raise DatabaseURLError(f"unsupported database dialect {name!r}")
        self.dialect: Dialect = "sqlite" if name == "sqlite" else "postgresql"
        self._writer: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        # PostgreSQL only: analyzes fast-growing tables whose cached plans went stale.
        self.statistics = PlannerStatistics(self) if self.dialect == "postgresql" else None

    @classmethod
    def open(cls, url: str | sa.URL, *, pool_size: int = 10, echo: bool = False) -> Database:
        """Create the engine for `url` (the schema is not touched; see store.migrate)."""
        target = async_url(url)
        # Last in, first out: a quiet manager keeps reusing its few warm connections (their
        # prepared statements on PostgreSQL, their page cache on SQLite) instead of rotating
        # through the whole pool; the rest sit idle until a burst needs them.
        kwargs: dict[str, Any] = {"echo": echo, "pool_use_lifo": True}
        if target.get_backend_name() == "sqlite":
            assert target.database is not None
            path = Path(target.database).expanduser()
            path.parent.mkdir(parents=True, exist_ok=True)
            kwargs["pool_size"] = pool_size
            kwargs["async_creator"] = partial(inline_sqlite.connect, str(path))
            kwargs["json_deserializer"] = loads_or_text
        else:
            kwargs["pool_size"] = pool_size
            kwargs["max_overflow"] = pool_size
            # A manager runs a few hundred distinct statements (coordinator, API, agents); past
            # a cache of 100 each would be prepared again on every other use. SQLAlchemy's own
            # statements use its adapter's cache, direct statements (`_direct`) asyncpg's.
            kwargs["connect_args"] = {
                "prepared_statement_cache_size": PREPARED_STATEMENTS,
                "statement_cache_size": PREPARED_STATEMENTS,
            }
        kwargs["json_serializer"] = json_text.dumps  # json.dumps's text, faster
        engine = create_async_engine(target, **kwargs)
        if engine.dialect.name == "sqlite":
            _configure_sqlite(engine)
        return cls(engine)

    @property
    def url(self) -> sa.URL:
        """The engine's URL (with the async driver)."""
        return self.engine.url

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncConnection]:
        """A write transaction: committed when the block exits, rolled back on error."""
        if self.dialect == "sqlite":
            async with self._writer_lock(), self._sqlite_transaction(write=True) as conn:
                yield conn
            return
        async with self.engine.connect() as conn, conn.begin():
            yield conn
        if self.statistics is not None:
            self.statistics.written()

    @asynccontextmanager
    async def _sqlite_transaction(self, *, write: bool) -> AsyncIterator[AsyncConnection]:
        """A SQLite transaction opened and ended in one step each.

        `engine.connect()` and `begin()` as context managers cross into SQLAlchemy's greenlet
        four times and close the connection in a task of its own (so a cancelled caller cannot
        abandon the close): 93 µs for an empty read, 135 µs for a write. Here connect and
        BEGIN are one crossing, COMMIT (or ROLLBACK) and the return to the pool another. On a
        local file neither waits on anything (see _inline_sqlite), so there is no point at
        which a cancellation could interrupt them; a BEGIN IMMEDIATE that meets another
        process's lock does wait, and then a cancellation closes the connection it opened.
        """
        sync_conn = await greenlet_spawn(_sqlite_begin, self.engine.sync_engine, write)
        conn = AsyncConnection(self.engine, sync_conn)
        try:
            yield conn
        except BaseException:
            await greenlet_spawn(_sqlite_end, sync_conn, False)
            raise
        await greenlet_spawn(_sqlite_end, sync_conn, True)

    def _writer_lock(self) -> asyncio.Lock:
        """This event loop's SQLite writer lock (an asyncio lock belongs to one loop)."""
        loop = asyncio.get_running_loop()
        if self._writer is None or self._writer[0] is not loop:
            self._writer = (loop, asyncio.Lock())
        return self._writer[1]

    @asynccontextmanager
    async def read(self) -> AsyncIterator[AsyncConnection]:
        """A read-only transaction (a consistent snapshot on both backends).

        SQLite's deferred read transaction holds one snapshot of the WAL from its first read.
        PostgreSQL's default, READ COMMITTED, would give every statement a snapshot of its own,
        so a read of several statements (a scheduling snapshot: candidates, agents, usage) could
        mix two states; reads run REPEATABLE READ, READ ONLY (the same single BEGIN; the pool
        restores the connection's defaults when it is returned).
        """
        if self.dialect == "sqlite":
            async with self._sqlite_transaction(write=False) as conn:
                yield conn
            return
        async with self.engine.connect() as conn:
            await conn.execution_options(**_PG_READ_OPTIONS)
            async with conn.begin():
                yield conn

    @asynccontextmanager
    async def read_statements(self) -> AsyncIterator[AsyncConnection]:
        """A read connection whose statements are each consistent alone, not with each other.

        For reads of one statement, or of statements that need not see one state (each reads
        data the others do not depend on). On PostgreSQL every statement runs in autocommit,
        its own snapshot, with no BEGIN and COMMIT round trips: a one-statement read cost
        640 µs of wall time and 460 µs of the manager's CPU in a transaction, 290 and 240
        without. On SQLite, where a transaction costs no round trip, it is `read()`.
        """
        if self.dialect == "postgresql":
            async with self.autocommit() as conn:
                yield conn
        else:
            async with self.read() as conn:
                yield conn

    @asynccontextmanager
    async def autocommit(self) -> AsyncIterator[AsyncConnection]:
        """A connection whose every statement is its own transaction (PostgreSQL only).

        For work that is one statement: no BEGIN and COMMIT round trips around it.
        """
        if self.dialect != "postgresql":
            raise ValueError("autocommit connections are for PostgreSQL; use transaction()")
        async with self.engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            yield conn

    async def close(self) -> None:
        """Dispose of the engine's pool; idempotent."""
        if self.statistics is not None:
            await self.statistics.close()
        await self.engine.dispose()


def _sqlite_begin(sync_engine: sa.Engine, write: bool) -> sa.Connection:
    conn = sync_engine.connect()
    try:
        if write:
            conn.execution_options(**{_WRITE_OPTION: True})
        conn.begin()
    except BaseException:
        conn.close()
        raise
    return conn


def _sqlite_end(conn: sa.Connection, commit: bool) -> None:
    try:
        transaction = conn.get_transaction()
        if transaction is not None:
            if commit:
                transaction.commit()
            else:
                transaction.rollback()
    finally:
        conn.close()


def _configure_sqlite(engine: AsyncEngine) -> None:
    sync_engine = engine.sync_engine

    @event.listens_for(sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take over transaction control from the driver so BEGIN IMMEDIATE can be issued.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # Before WAL: a database's page size is set by its first table, and cannot change in WAL.
        cursor.execute(f"PRAGMA page_size={SQLITE_PAGE_SIZE}")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        # 64 MiB of page cache instead of 2: a batch of 10,000 sessions with their kernels and
        # history touches more pages than the default holds.
        cursor.execute("PRAGMA cache_size=-65536")
        cursor.execute("PRAGMA temp_store=MEMORY")
        cursor.execute("PRAGMA page_size")
        (page_size,) = cursor.fetchone()
        cursor.execute(f"PRAGMA wal_autocheckpoint={SQLITE_WAL_CHECKPOINT_BYTES // page_size}")
        cursor.close()

    @event.listens_for(sync_engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        write = conn.get_execution_options().get(_WRITE_OPTION)
        driver = cast(inline_sqlite.InlineConnection, conn.connection.driver_connection)
        inline_sqlite.begin(driver, "BEGIN IMMEDIATE" if write else "BEGIN")
