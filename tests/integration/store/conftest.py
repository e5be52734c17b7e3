"""Fixtures of the store's integration tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.store.database import Database
from tests.conftest import create_postgres_database, drop_postgres_database, require_server


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
async def empty_db(
    request: pytest.FixtureRequest, tmp_path: Path, postgres_unreachable: str | None
) -> AsyncIterator[Database]:
    """A database with no tables at all."""
    if request.param == "sqlite":
        db = Database.open(f"sqlite:///{tmp_path / 'empty.db'}")
        yield db
        await db.close()
        return
    require_server("PostgreSQL", postgres_unreachable)
    url = await create_postgres_database(template=None)
    db = Database.open(url)
    yield db
    await db.close()
    await drop_postgres_database(url)
