"""Throw-away databases for benchmarks: never touch the data behind a URL the user gave."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import sqlalchemy as sa

from corral.store.database import Database, async_url
from corral.store.migrate import upgrade


@asynccontextmanager
async def scratch_database(url: str) -> AsyncIterator[Database]:
    """A fresh, migrated database next to `url`, dropped afterwards.

    `sqlite` (or any sqlite URL) means a temporary file; for PostgreSQL, `url` is used only to
    create and later drop a database named `corral_bench_<random>` on the same server.
    """
    if url == "sqlite" or url.startswith("sqlite"):
        with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
            db = Database.open(f"sqlite:///{Path(tmp) / 'bench.db'}")
            try:
                await upgrade(db)
                yield db
            finally:
                await db.close()
        return
    server = async_url(url)
    name = f"corral_bench_{uuid.uuid4().hex[:12]}"
    await _admin(server, f'CREATE DATABASE "{name}"')
    db = Database.open(server.set(database=name))
    try:
        await upgrade(db)
        yield db
    finally:
        await db.close()
        await _admin(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def _admin(server: sa.URL, statement: str) -> None:
    admin = Database.open(server, pool_size=1)
    try:
        async with admin.engine.connect() as conn:
            conn = await conn.execution_options(isolation_level="AUTOCOMMIT")
            await conn.execute(sa.text(statement))
    finally:
        await admin.close()


class StatementCounter:
    """Counts the SQL statements (executemany counts once) sent through a database."""

    def __init__(self, db: Database) -> None:
        self.count = 0
        sa.event.listen(db.engine.sync_engine, "before_cursor_execute", self._on_execute)

    def _on_execute(self, *_args: object) -> None:
        self.count += 1
