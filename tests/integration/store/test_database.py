"""Database's connection kinds beyond read and write transactions."""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa

from corral.store._sql import in_param
from corral.store.database import (
    SQLITE_PAGE_SIZE,
    SQLITE_WAL_CHECKPOINT_BYTES,
    Database,
)
from corral.store.tables import agents
from tests.conftest import postgresql_only
from tests.integration.store._factories import NOW, add_user

_USER = sa.text("INSERT INTO users (id, name, role, created_at) VALUES (:id, :name, 'user', :at)")


async def test_autocommit_commits_each_statement_at_once(db: Database) -> None:
    """A statement on an autocommit connection is visible elsewhere before the block ends;
    SQLite has no such connection (its writers go through transaction())."""
    if db.dialect == "sqlite":
        with pytest.raises(ValueError, match="PostgreSQL"):
            async with db.autocommit():
                pass
        return
    user_id = uuid.uuid4()
    async with db.autocommit() as conn:
        await conn.execute(_USER, {"id": user_id, "name": "auto", "at": NOW})
        async with db.read() as other:
            seen = await other.scalar(
                sa.text("SELECT name FROM users WHERE id = :id"), {"id": user_id}
            )
        assert seen == "auto"


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
async def test_sqlite_databases_get_large_pages_and_seldom_checkpoints(db: Database) -> None:
    """A database corral creates has SQLITE_PAGE_SIZE pages; every pooled connection, reading
    or writing, is in WAL mode and copies the WAL back only once it holds
    SQLITE_WAL_CHECKPOINT_BYTES (SQLite's own default is 1,000 pages)."""
    async with db.read() as reading, db.transaction() as writing:
        for conn in (reading, writing):
            assert await conn.scalar(sa.text("PRAGMA page_size")) == SQLITE_PAGE_SIZE
            assert await conn.scalar(sa.text("PRAGMA journal_mode")) == "wal"
            pages = await conn.scalar(sa.text("PRAGMA wal_autocheckpoint"))
            assert pages == SQLITE_WAL_CHECKPOINT_BYTES // SQLITE_PAGE_SIZE > 1_000


async def test_an_existing_sqlite_database_keeps_its_page_size(tmp_path: Path) -> None:
    """A database made with SQLite's default 4 KiB pages opens as it is (its page size is
    fixed), and its checkpoints still come every SQLITE_WAL_CHECKPOINT_BYTES."""
    path = tmp_path / "old.db"
    with contextlib.closing(sqlite3.connect(path)) as old:
        old.execute("PRAGMA page_size=4096")
        old.execute("PRAGMA journal_mode=WAL")
        old.execute("CREATE TABLE kept (n INTEGER)")
        old.execute("INSERT INTO kept VALUES (7)")
        old.commit()
    db = Database.open(f"sqlite:///{path}")
    try:
        async with db.transaction() as conn:
            assert await conn.scalar(sa.text("SELECT n FROM kept")) == 7
            assert await conn.scalar(sa.text("PRAGMA page_size")) == 4096
            pages = await conn.scalar(sa.text("PRAGMA wal_autocheckpoint"))
            assert pages == SQLITE_WAL_CHECKPOINT_BYTES // 4096
    finally:
        await db.close()


async def _driver_identity(conn: sa.ext.asyncio.AsyncConnection) -> object:
    """The raw driver connection behind `conn` (identity, not equality)."""
    raw = await conn.get_raw_connection()
    return id(raw.driver_connection)


async def test_a_quiet_caller_keeps_reusing_the_most_recent_connection(db: Database) -> None:
    """With several connections pooled, one caller at a time gets the last one returned (LIFO),
    so its prepared statements and page cache stay warm instead of rotating through the pool."""
    async with db.read() as first, db.read() as second, db.read() as third:
        pooled = {await _driver_identity(c) for c in (first, second, third)}
        last_returned = await _driver_identity(first)  # exits last
    assert len(pooled) == 3
    for _ in range(5):
        async with db.read() as conn:
            assert await _driver_identity(conn) == last_returned


@postgresql_only
async def test_postgresql_connections_keep_hundreds_of_statements_prepared(db: Database) -> None:
    """A manager runs more distinct statements than asyncpg's default cache of 100 holds: each
    connection keeps them all prepared rather than preparing them again on reuse."""
    async with db.read() as conn:
        for n in range(150):
            await conn.execute(sa.text(f"SELECT {n} AS n"))
        prepared = await conn.scalar(
            sa.text(
                "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE 'SELECT % AS n'"
            )
        )
    assert prepared == 150


_USER_COUNT = sa.text("SELECT count(*) FROM users")


async def test_a_read_sees_one_snapshot_across_its_statements(db: Database) -> None:
    """A user added by a writer between two statements of one read is not seen by the second;
    the next read sees it. (On PostgreSQL's default READ COMMITTED the second would see it.)"""
    async with db.read() as conn:
        before = await conn.scalar(_USER_COUNT)
        await add_user(db)
        assert await conn.scalar(_USER_COUNT) == before
    async with db.read() as conn:
        assert await conn.scalar(_USER_COUNT) == before + 1


@postgresql_only
async def test_postgresql_reads_refuse_writes_and_leave_the_pooled_connection_as_it_was(
    db: Database,
) -> None:
    """A write inside read() fails (the transaction is READ ONLY); the connection goes back to
    the pool with PostgreSQL's defaults, so a write transaction that reuses it can write."""
    with pytest.raises(sa.exc.DBAPIError, match="read-only"):
        async with db.read() as conn:
            await conn.execute(_USER, {"id": uuid.uuid4(), "name": "refused", "at": NOW})
    async with db.transaction() as conn:
        assert await conn.scalar(sa.text("SHOW transaction_isolation")) == "read committed"
        await conn.execute(_USER, {"id": uuid.uuid4(), "name": "written", "at": NOW})


@postgresql_only
async def test_an_id_list_stays_a_join_in_a_generic_plan(db: Database) -> None:
    """asyncpg prepares every statement, and PostgreSQL may keep a generic plan for it from the
    sixth run on. There `column = ANY ($1)` is a linear search of the array for every row read
    (1,000 agents against 1,000 ids: 25 ms instead of 1.3). An id list must be planned as a
    join whatever the plan: no `= ANY` filter in the generic plan of a hot agents query."""
    query = sa.select(agents.c.id, agents.c.assignment_revision).where(
        in_param(db.dialect, agents.c.id, "ids")
    )
    sql = str(query.compile(dialect=db.engine.dialect))
    async with db.engine.connect() as conn:
        raw = (await conn.get_raw_connection()).driver_connection
        await raw.execute("SET plan_cache_mode = force_generic_plan")
        try:
            statement = await raw.prepare(f"EXPLAIN {sql}")
            plan = "\n".join(row[0] for row in await statement.fetch(["a", "b"]))
        finally:
            await raw.execute("RESET plan_cache_mode")
    assert "unnest" in plan
    assert "= ANY" not in plan


async def test_read_statements_take_a_snapshot_each_on_postgresql(db: Database) -> None:
    """On PostgreSQL each statement of `read_statements` sees what committed before it (no
    transaction around them, so no BEGIN/COMMIT round trips); on SQLite it is a read transaction,
    one snapshot for all."""
    count = sa.text("SELECT count(*) FROM users")
    async with db.read_statements() as conn:
        before = await conn.scalar(count)
        await add_user(db)
        after = await conn.scalar(count)
    assert after == (before + 1 if db.dialect == "postgresql" else before)
