"""The migrations build exactly the schema the models describe, on both backends."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from corral.store.database import Database
from corral.store.migrate import current_revision, head_revision, upgrade
from corral.store.tables import metadata, resource_groups


async def test_migrations_on_empty_database_match_the_models(empty_db: Database) -> None:
    """Upgrading an empty database to head leaves no difference from the table models."""
    assert await current_revision(empty_db) is None
    await upgrade(empty_db)
    assert await current_revision(empty_db) == head_revision()

    def diff(connection: sa.Connection) -> list[object]:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        return list(compare_metadata(context, metadata))

    async with empty_db.read() as conn:
        differences = await conn.run_sync(diff)
    assert differences == []


async def test_upgrade_is_idempotent_and_seeds_the_default_group(empty_db: Database) -> None:
    """Running the migrations twice is harmless and the `default` resource group exists once."""
    await upgrade(empty_db)
    await upgrade(empty_db)
    async with empty_db.read() as conn:
        names = (await conn.execute(sa.select(resource_groups.c.name))).scalars().all()
    assert names == ["default"]


@pytest.mark.parametrize(
    "empty_db", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True
)
async def test_table_storage_options_follow_the_models(empty_db: Database) -> None:
    """PostgreSQL tables get the storage options the models declare (fillfactor for HOT)."""
    await upgrade(empty_db)
    declared = {
        table.name: table.dialect_options["postgresql"]["with"]
        for table in metadata.sorted_tables
        if table.dialect_options["postgresql"].get("with")
    }
    assert declared, "some table declares storage options"
    async with empty_db.read() as conn:
        for name, options in declared.items():
            reloptions = await conn.scalar(
                sa.text("SELECT reloptions FROM pg_class WHERE relname = :name"), {"name": name}
            )
            assert {f"{k}={v}" for k, v in options.items()} <= set(reloptions or []), name


@pytest.mark.parametrize(
    "empty_db", [pytest.param("postgresql", marks=pytest.mark.postgres)], indirect=True
)
async def test_only_the_tables_the_models_mark_are_unlogged(empty_db: Database) -> None:
    """Hints skip the WAL (they are not truth); every table holding truth is logged."""
    await upgrade(empty_db)
    async with empty_db.read() as conn:
        persistence = dict(
            (
                await conn.execute(
                    sa.text(
                        "SELECT relname, relpersistence::text FROM pg_class"
                        " WHERE relkind = 'r' AND relnamespace = 'public'::regnamespace"
                    )
                )
            ).all()
        )
    expected = {
        table.name: "u" if table.info.get("unlogged") else "p" for table in metadata.sorted_tables
    }
    assert expected["hints"] == "u"
    assert {name: persistence[name] for name in expected} == expected
