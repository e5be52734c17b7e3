"""PostgreSQL's planner statistics kept up with tables that outgrow them (store.planner_stats)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa

from corral.store.database import Database
from corral.store.planner_stats import MIN_PAGES, SAMPLE_TARGET, PlannerStatistics
from tests.conftest import postgresql_only
from tests.integration._statements import estimated_rows

_DEADLINE_S = 10.0


@pytest.fixture
async def probe(db: Database) -> AsyncIterator[str]:
    """A table of its own (not one of corral's: the shared database's reset leaves it alone)."""
    name = f"probe_{uuid.uuid4().hex[:8]}"
    async with db.autocommit() as conn:
        await conn.execute(sa.text(f"CREATE TABLE {name} (id int, pad text)"))
    try:
        yield name
    finally:
        async with db.autocommit() as conn:
            await conn.execute(sa.text(f"DROP TABLE {name}"))


async def _grow(db: Database, table: str, rows: int) -> None:
    async with db.transaction() as conn:
        await conn.execute(
            sa.text(
                f"INSERT INTO {table} SELECT g, repeat('x', 200) FROM generate_series(1, :n) g"
            ),
            {"n": rows},
        )


@postgresql_only
async def test_a_cached_plan_is_planned_again_once_its_table_outgrew_the_statistics(
    db: Database, probe: str
) -> None:
    """A statement prepared while its table was small keeps that plan as the table grows; the
    refresh analyzes the table (only once it outgrew its statistics) and the plan is remade."""
    stats = PlannerStatistics(db, tables=[probe])
    await _grow(db, probe, 10)
    async with db.engine.connect() as conn:
        await conn.exec_driver_sql(f"PREPARE probe_all AS SELECT * FROM {probe}")
        await conn.exec_driver_sql("EXECUTE probe_all")
        await conn.commit()
        await _grow(db, probe, 50_000)
        # The plan made when it was small:
        assert await estimated_rows(conn, "EXECUTE probe_all") < 10_000
        await conn.commit()  # a transaction holding the table's lock sees no invalidation
        assert await stats.refresh() == [probe]
        assert await estimated_rows(conn, "EXECUTE probe_all") > 40_000
        await conn.exec_driver_sql("DEALLOCATE probe_all")
        await conn.commit()
    assert await stats.refresh() == []  # no growth since


@postgresql_only
async def test_the_refresh_samples_coarsely_and_leaves_the_connections_target_alone(
    db: Database, probe: str
) -> None:
    """The refresh analyzes with SAMPLE_TARGET (a histogram of SAMPLE_TARGET buckets, not
    the server's 100), and only for itself: the pooled connection keeps the server's target."""
    await _grow(db, probe, 50_000)
    assert await PlannerStatistics(db, tables=[probe]).refresh() == [probe]
    async with db.read() as conn:
        bounds = await conn.scalar(
            sa.text(
                "SELECT array_length(histogram_bounds::text::int[], 1) FROM pg_stats"
                " WHERE tablename = :t AND attname = 'id'"
            ),
            {"t": probe},
        )
        assert bounds == SAMPLE_TARGET + 1
        assert await conn.scalar(sa.text("SHOW default_statistics_target")) == "100"


@postgresql_only
async def test_a_small_table_is_left_alone(db: Database, probe: str) -> None:
    """Below MIN_PAGES no plan is slow enough to be worth an ANALYZE."""
    await _grow(db, probe, 100)  # a few pages
    async with db.read() as conn:
        pages = await conn.scalar(sa.text(f"SELECT pg_relation_size('{probe}') / 8192"))
    assert 0 < pages < MIN_PAGES
    assert await PlannerStatistics(db, tables=[probe]).refresh() == []


@postgresql_only
async def test_a_write_transaction_has_the_tables_looked_at_once_an_interval(
    db: Database, probe: str
) -> None:
    """`Database.transaction` hands each commit to the statistics: the first one starts a look
    in the background; another within the interval does not."""
    now = [100.0]
    stats = PlannerStatistics(db, tables=[probe], clock=lambda: now[0])
    db.statistics = stats
    await _grow(db, probe, 20_000)
    deadline = time.monotonic() + _DEADLINE_S
    while await _counted_pages(db, probe) == 0:
        assert time.monotonic() < deadline, "the committed growth was never analyzed"
        await asyncio.sleep(0.02)
    counted = await _counted_pages(db, probe)
    await _grow(db, probe, 60_000)  # outgrown again, but within the interval
    await stats.close()  # let nothing still running finish
    assert await _counted_pages(db, probe) == counted
    now[0] += 5
    await _grow(db, probe, 1)
    deadline = time.monotonic() + _DEADLINE_S
    while await _counted_pages(db, probe) == counted:
        assert time.monotonic() < deadline, "the next commit after the interval did not look"
        await asyncio.sleep(0.02)


async def _counted_pages(db: Database, table: str) -> int:
    async with db.read_statements() as conn:
        return int(
            await conn.scalar(
                sa.text("SELECT relpages FROM pg_class WHERE relname = :t"), {"t": table}
            )
            or 0
        )


async def test_sqlite_has_no_planner_statistics_to_keep(db: Database) -> None:
    """SQLite plans each statement afresh from its indexes: nothing to refresh there."""
    assert (db.statistics is None) == (db.dialect == "sqlite")
