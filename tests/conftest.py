"""Shared fixtures: a fresh, migrated database per test on SQLite and on PostgreSQL.

SQLite tests copy a migrated template file. PostgreSQL tests share one migrated database that
is reset before each test: other sessions on it are ended (their locks and LISTENs go with them),
every table is emptied, the rows the migrations seed are put back and the sequences restart.
That costs a few milliseconds, where cloning a template (CREATE DATABASE ... TEMPLATE) and
dropping it cost 0.3 to 1 s per test on a slow disk. No test pays for running the migrations.
Without a reachable server the PostgreSQL variants are skipped (one summary line says so); with
CI=true a missing server is a failure instead.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pytest
import sqlalchemy as sa

from corral.store.database import Database
from corral.store.migrate import upgrade
from corral.store.tables import metadata
from corral.testing.redis_server import RedisServer
from corral.testing.tcp_proxy import TcpProxy

POSTGRES_URL = os.environ.get(
    "CORRAL_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("CORRAL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# Servers nothing listens for (port 1): a connection there is refused at once.
UNREACHABLE_REDIS_URL = "redis://127.0.0.1:1/0"
UNREACHABLE_POSTGRES_URL = "postgresql://postgres@127.0.0.1:1/test"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

_skipped: dict[str, int] = {}
T = TypeVar("T")


def run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run a self-contained coroutine to completion from synchronous fixture code.

    A fixture may be set up from inside a running event loop (an async fixture asking for it
    with `request.getfixturevalue`), where `asyncio.run` is not allowed: then the coroutine runs
    on a fresh loop in a worker thread. It must open and close its own connections.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


@functools.cache
def _postgres_reachable() -> str | None:
    """None when the test server answers, else the reason it does not (probed once)."""

    async def probe() -> None:
        db = Database.open(POSTGRES_URL, pool_size=1)
        try:
            async with db.read() as conn:
                await conn.execute(sa.text("SELECT 1"))
        finally:
            await db.close()

    return _unreachable_reason(probe)


@functools.cache
def _redis_reachable() -> str | None:
    """None when the test Redis answers, else the reason it does not (probed once)."""
    import redis.asyncio as aioredis

    async def probe() -> None:
        client = aioredis.from_url(REDIS_URL)
        try:
            await client.ping()
        finally:
            await client.aclose()

    return _unreachable_reason(probe)


def _unreachable_reason(probe: Callable[[], Coroutine[Any, Any, None]]) -> str | None:
    """None when `probe` completes within 5 s, else the first line of why it did not."""
    try:
        run_sync(asyncio.wait_for(probe(), timeout=5))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def require_server(kind: str, reason: str | None) -> None:
    """Skip (or, in CI, fail) the calling test when a server is missing."""
    if reason is None:
        return
    if IN_CI:
        pytest.fail(f"{kind} is required in CI but not reachable: {reason}")
    _skipped[kind] = _skipped.get(kind, 0) + 1
    pytest.skip(f"{kind} not reachable: {reason}")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _skipped:
        missing = ", ".join(f"{kind} ({count} tests)" for kind, count in sorted(_skipped.items()))
        terminalreporter.write_line(
            f"corral: skipped the variants that need a server that is not reachable: {missing}; "
            "with CI=true this is a failure"
        )


@pytest.fixture(scope="session")
def postgres_unreachable() -> str | None:
    """Why the PostgreSQL test server cannot be used, or None when it can."""
    return _postgres_reachable()


@pytest.fixture(scope="session")
def redis_unreachable() -> str | None:
    """Why the Redis test server cannot be used, or None when it can."""
    return _redis_reachable()


@pytest.fixture
def redis_url(redis_unreachable: str | None) -> str:
    """The test Redis URL (skips, or fails in CI, when Redis is down)."""
    require_server("Redis", redis_unreachable)
    return REDIS_URL


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, to kill and start again (never the machine's)."""
    server = RedisServer(tmp_path / "own-redis").start()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
async def postgres_proxy(postgres_unreachable: str | None) -> AsyncIterator[TcpProxy]:
    """A TCP proxy in front of the test PostgreSQL, to cut and restore (never the server)."""
    require_server("PostgreSQL", postgres_unreachable)
    target = urlsplit(POSTGRES_URL)
    async with TcpProxy(target.hostname or "127.0.0.1", target.port or 5432) as proxy:
        yield proxy


def through_proxy(url: str, proxy: TcpProxy) -> str:
    """The PostgreSQL `url` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    at = "@" if credentials else ""
    return parts._replace(netloc=f"{credentials}{at}127.0.0.1:{proxy.port}").geturl()


@pytest.fixture
def namespace() -> str:
    """A key/channel prefix unique to this test, so tests sharing a server never collide."""
    return f"corral-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def postgres_template() -> Iterator[str | None]:
    """Name of a migrated template database on the test server (None when unreachable)."""
    reason = _postgres_reachable()
    if reason is not None:
        yield None
        return
    name = f"corral_tpl_{os.getpid()}"
    admin = sa.make_url(POSTGRES_URL)

    async def create() -> None:
        await _admin_execute(f'DROP DATABASE IF EXISTS "{name}"', f'CREATE DATABASE "{name}"')
        db = Database.open(admin.set(database=name), pool_size=1)
        try:
            await upgrade(db)
        finally:
            await db.close()

    run_sync(create())
    yield name
    run_sync(_admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def _admin_execute(*statements: str) -> None:
    db = Database.open(POSTGRES_URL, pool_size=1)
    try:
        async with db.autocommit() as conn:  # CREATE/DROP DATABASE refuse a transaction
            for statement in statements:
                await conn.execute(sa.text(statement))
    finally:
        await db.close()


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite file that each test copies."""
    path = tmp_path_factory.mktemp("template") / "corral.db"

    async def create() -> None:
        db = Database.open(f"sqlite:///{path}", pool_size=1)
        try:
            await upgrade(db)
        finally:
            await db.close()  # the last connection to close checkpoints the WAL into the file

    run_sync(create())
    return path


async def create_postgres_database(template: str | None) -> str:
    """A new database on the test server (a clone of `template`, or empty); returns its URL."""
    name = f"corral_t_{uuid.uuid4().hex[:16]}"
    clone = f' TEMPLATE "{template}"' if template else ""
    await _admin_execute(f'CREATE DATABASE "{name}"{clone}')
    return sa.make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)


async def drop_postgres_database(url: str) -> None:
    """Drop a database made by create_postgres_database, whoever is still connected."""
    await _admin_execute(f'DROP DATABASE IF EXISTS "{sa.make_url(url).database}" WITH (FORCE)')


@pytest.fixture(scope="session")
def postgres_shared(postgres_template: str | None) -> Iterator[_SharedDatabase | None]:
    """The database every PostgreSQL test gets, reset before each (None when unreachable)."""
    if postgres_template is None:
        yield None
        return
    url = run_sync(create_postgres_database(postgres_template))
    shared = run_sync(_SharedDatabase.capture(url))
    yield shared
    run_sync(drop_postgres_database(url))


@pytest.fixture
def postgres_database_url(postgres_shared: _SharedDatabase | None) -> str:
    """The URL of a migrated PostgreSQL database, as fresh as a new one (skips, or fails in CI,
    without a server)."""
    require_server("PostgreSQL", None if postgres_shared else _postgres_reachable())
    assert postgres_shared is not None
    run_sync(postgres_shared.reset())
    return postgres_shared.url


class _SharedDatabase:
    """A migrated database and what its migrations left in it, to go back to before a test."""

    def __init__(self, url: str, seeds: dict[str, list[dict[str, Any]]], sequences: list[str]):
        self.url = url
        self.seeds = seeds  # table → rows the migrations inserted
        self.sequences = sequences

    @classmethod
    async def capture(cls, url: str) -> _SharedDatabase:
        db = Database.open(url, pool_size=1)
        try:
            async with db.read() as conn:
                seeds = {}
                for table in metadata.sorted_tables:
                    rows = [dict(row._mapping) for row in await conn.execute(sa.select(table))]
                    if rows:
                        seeds[table.name] = rows
                sequences = list(
                    (await conn.execute(sa.text("SELECT sequencename FROM pg_sequences"))).scalars()
                )
        finally:
            await db.close()
        return cls(url, seeds, sequences)

    async def reset(self) -> None:
        """End every other session on it, empty every table, put the seeds back."""
        name = sa.make_url(self.url).database
        db = Database.open(self.url, pool_size=1)
        try:
            async with db.transaction() as conn:
                await conn.execute(
                    sa.text(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = :name AND pid <> pg_backend_pid()"
                    ),
                    {"name": name},
                )
                for table in reversed(metadata.sorted_tables):
                    await conn.execute(table.delete())
                for table in metadata.sorted_tables:
                    if table.name in self.seeds:
                        await conn.execute(table.insert(), self.seeds[table.name])
                for sequence in self.sequences:
                    await conn.execute(sa.text(f'ALTER SEQUENCE "{sequence}" RESTART'))
        finally:
            await db.close()


# For a test of PostgreSQL alone: the `db` (and `database_url`) it gets are PostgreSQL's only.
postgresql_only = pytest.mark.parametrize(
    "database_url", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True
)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path, sqlite_template: Path) -> str:
    """The URL of a fresh, migrated database: a SQLite file, or a PostgreSQL database."""
    if request.param == "sqlite":
        path = tmp_path / "corral.db"
        shutil.copyfile(sqlite_template, path)
        return f"sqlite:///{path}"
    return str(request.getfixturevalue("postgres_database_url"))


@pytest.fixture
async def db(database_url: str) -> AsyncIterator[Database]:
    """An open Database on a fresh, migrated database of either backend."""
    database = Database.open(database_url)
    try:
        yield database
    finally:
        await database.close()


@pytest.fixture
async def two_writers(postgres_database_url: str) -> AsyncIterator[tuple[Database, Database]]:
    """Two Database objects (two pools) on one PostgreSQL database: truly concurrent writers.

    PostgreSQL only: SQLite serialises writers (BEGIN IMMEDIATE), so there is no race to test.
    """
    first, second = Database.open(postgres_database_url), Database.open(postgres_database_url)
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()
