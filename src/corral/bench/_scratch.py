"""Throw-away databases for benchmarks: never touch the data behind a URL the user gave."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa

from corral.domain.session import NewSession
from corral.domain.types import AgentId, SessionId, UserId, new_session_id
from corral.store.agents import NewAgent, insert_agents
from corral.store.database import Database, async_url
from corral.store.migrate import upgrade
from corral.store.placements import KernelPlacement, SessionPlacement, commit_placements
from corral.store.sessions import SessionRepository
from corral.store.tables import users

SEED_AGENTS = 100


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


async def seed_placed_sessions(db: Database, count: int, now: datetime) -> list[SessionId]:
    """`count` single-kernel one-cpu sessions of one owner, placed (SCHEDULED) round-robin on
    `SEED_AGENTS` agents just large enough (`bench-NNN`, in group `default`)."""
    owner = UserId(uuid.uuid4())
    async with db.transaction() as conn:
        await conn.execute(
            users.insert(), [{"id": owner, "name": "bench", "role": "user", "created_at": now}]
        )
    agents = [AgentId(f"bench-{i:03d}") for i in range(SEED_AGENTS)]
    per_agent = -(-count // SEED_AGENTS)
    await insert_agents(
        db,
        [NewAgent(a, f"10.0.0.{i}", {"cpu": per_agent * 1000}) for i, a in enumerate(agents)],
        now,
    )
    ids = [new_session_id() for _ in range(count)]
    await SessionRepository(db).insert(
        [
            NewSession(
                id=sid,
                owner_id=owner,
                type="BATCH",
                resource_group="default",
                cluster_mode="single-node",
                cluster_size=1,
                spec={"image": "python", "command": ["true"]},
                kernel_slots={"cpu": 1000},
            )
            for sid in ids
        ],
        now,
    )
    plan = [
        SessionPlacement(sid, (KernelPlacement(0, agents[i % SEED_AGENTS], {"cpu": 1000}),))
        for i, sid in enumerate(ids)
    ]
    placed = await commit_placements(db, plan, now)
    assert len(placed.placed) == count, "bench setup: every session must be placed"
    return ids
