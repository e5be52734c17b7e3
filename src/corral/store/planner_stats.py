"""PostgreSQL's planner statistics, kept up with tables that grow fast.

PostgreSQL plans a prepared statement without parameters once and keeps that plan until the
tables' statistics change. corral's hot statements are prepared (asyncpg's statement cache), so
one first run while `sessions` and `kernels` held a few rows fixes its plan: on a fresh database
that then took 20,000 sessions, the scheduler's load of the pending sessions kept a nested loop
over a sequential scan of `kernels`, 12,000 x 6,000 rows, 17.8 s for one statement (auto_explain,
`corral simulate` on PostgreSQL). Autovacuum would analyze the tables, but only on its next
round (every minute by default) and only after a tenth of a table changed.

So a manager on PostgreSQL looks, at most once a second and only after it wrote something, at
how many pages each watched table has against how many the planner last counted, and analyzes
the tables that have doubled (from MIN_PAGES on). ANALYZE refreshes the statistics and makes
every cached plan that reads the table plan again. A table that doubles on each look costs
O(log n) analyzes over its growth; an idle manager looks at nothing.

These analyzes sample SAMPLE_TARGET x 300 rows, not the server's default (100 x 300). What they
are for is the plan's shape (how many rows, which index), not fine histograms: a tenth of the
sample costs a seventh of the time (analyzing the five watched tables after a 20,000-session
`corral simulate`: 73 against 517 ms), and those analyzes were a tenth of the server's CPU in
such a run. Autovacuum, where it runs, analyzes with the server's own target later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import sqlalchemy as sa

if TYPE_CHECKING:
    from corral.store.database import Database

logger = logging.getLogger(__name__)

# The tables the hot statements join or filter in bulk.
WATCHED_TABLES = (
    "sessions",
    "kernels",
    "agent_kernels",
    "session_scheduling_history",
    "kernel_scheduling_history",
)
GROWTH_FACTOR = 2.0  # analyze once a table has this many times the pages the planner counted
MIN_PAGES = 64  # below this (512 KiB) any plan is quick
SAMPLE_TARGET = 10  # default_statistics_target for these analyzes (the server's default: 100)
CHECK_INTERVAL_S = 1.0

_SIZES = sa.text(
    "SELECT c.relname, c.relpages, pg_relation_size(c.oid) / current_setting('block_size')::int"
    " FROM pg_class c"
    " WHERE c.relname = ANY(:names) AND c.relkind = 'r'"
    " AND c.relnamespace = current_schema()::regnamespace"
)


def outgrown(counted_pages: int, pages: int) -> bool:
    """Whether a table of `pages` has outgrown the `counted_pages` its statistics hold."""
    return pages >= MIN_PAGES and pages >= GROWTH_FACTOR * max(counted_pages, 0)


class PlannerStatistics:
    """Analyzes the watched tables of one PostgreSQL database when they have outgrown their
    statistics; `written()` after each write transaction, the look happens in the background."""

    def __init__(
        self,
        db: Database,
        *,
        tables: Sequence[str] = WATCHED_TABLES,
        interval_s: float = CHECK_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._db = db
        self._tables = list(tables)
        self._interval_s = interval_s
        self._clock = clock
        self._last_look = -float("inf")
        self._task: asyncio.Task[list[str]] | None = None

    def written(self) -> None:
        """Something was committed: look at the tables soon, unless a look is recent or running."""
        now = self._clock()
        if now - self._last_look < self._interval_s or (self._task and not self._task.done()):
            return
        self._last_look = now
        self._task = asyncio.get_running_loop().create_task(
            self._look_quietly(), name="planner-statistics"
        )

    async def refresh(self) -> list[str]:
        """Analyze the tables that outgrew their statistics; the names of those analyzed."""
        async with self._db.autocommit() as conn:
            rows = (await conn.execute(_SIZES, {"names": self._tables})).all()
            grown = [name for name, counted, pages in rows if outgrown(counted, pages)]
        if grown:
            # In a transaction of its own, for SET LOCAL: the pooled connection keeps the
            # server's target for everything else.
            async with self._db.engine.begin() as conn:
                await conn.execute(
                    sa.text(f"SET LOCAL default_statistics_target = {int(SAMPLE_TARGET)}")
                )
                # Names from our own list (and pg_class), never from input.
                await conn.execute(sa.text("ANALYZE " + ", ".join(f'"{n}"' for n in grown)))
            logger.debug("analyzed %s: they had outgrown the planner's statistics", grown)
        return grown

    async def close(self) -> None:
        """Stop a look in progress."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _look_quietly(self) -> list[str]:
        try:
            return await self.refresh()
        except Exception:  # not a cancellation (a BaseException), which propagates
            # Statistics are an optimisation: a failed look (a closing pool, a lost connection)
            # must not disturb the write that asked for it. Autovacuum still runs.
            logger.warning("could not refresh the planner's statistics", exc_info=True)
            return []
