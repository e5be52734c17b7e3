"""Apply the schema migrations (Alembic) to a database, on either backend."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from corral.store.database import Database

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def alembic_config() -> Config:
    """The Alembic configuration pointing at corral's migrations."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def head_revision() -> str:
    """The newest migration revision shipped with this version of corral."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None
    return head


async def upgrade(db: Database, revision: str = "head") -> None:
    """Bring the schema up to `revision` (idempotent)."""
    await _run(db, command.upgrade, revision)


async def downgrade(db: Database, revision: str) -> None:
    """Take the schema back down to `revision` (what the migrations' `downgrade` steps undo)."""
    await _run(db, command.downgrade, revision)


async def _run(db: Database, step: Callable[[Config, str], None], revision: str) -> None:
    def run(connection: sa.Connection) -> None:
        config = alembic_config()
        config.attributes["connection"] = connection
        step(config, revision)

    async with db.transaction() as conn:
        await conn.run_sync(run)


async def current_revision(db: Database) -> str | None:
    """The revision the database is at, or None for an empty database."""

    def read(connection: sa.Connection) -> str | None:
        return MigrationContext.configure(connection).get_current_revision()

    async with db.read() as conn:
        return await conn.run_sync(read)
