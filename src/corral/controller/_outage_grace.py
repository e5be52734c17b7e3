"""No agent is lost for a silence the manager caused: a grace period after a database outage.

While the database is down, agents' heartbeats fail (503/500) and they back off; once it is
back, their next heartbeat may be many seconds away. Declaring them LOST at the first sweep
after the outage would fail every running kernel with `agent_lost` although every agent is
fine. So after a sweep fails on the database, the next one only checks that the database is
back; from then on agents get one full heartbeat timeout before any is declared lost.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TypeVar

import sqlalchemy as sa

from corral.store.database import Database
from corral.store.unavailable import database_unavailable

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


class OutageGrace:
    """Runs the lost sweep, or skips it (`on_grace`) within a timeout of a database outage."""

    def __init__(self, db: Database, timeout_s: float) -> None:
        self._db = db
        self._timeout = timedelta(seconds=timeout_s)
        self._outage = False  # a sweep failed on the database; not known to be back yet
        self.until: datetime | None = None  # no agent is declared lost before this

    async def run(
        self, now: datetime, sweep: Callable[[], Awaitable[_T]], on_grace: Callable[[], _T]
    ) -> _T:
        """`sweep()` unless within the grace period (then `on_grace()`); an outage starts one."""
        try:
            if self._outage:
                async with self._db.read_statements() as conn:
                    await conn.execute(sa.text("SELECT 1"))  # raises while still down
                self.answered(now)
            if self.within(now):
                return on_grace()
            return await sweep()
        except Exception as exc:
            self.failed(exc)
            raise

    def failed(self, error: BaseException) -> None:
        """A sweep's statement raised `error`: if the database is unavailable, an outage."""
        if database_unavailable(error):
            self._outage = True

    def answered(self, now: datetime) -> None:
        """The database answered a sweep's statement: after an outage, the grace starts now."""
        if not self._outage:
            return
        self._outage = False
        self.until = now + self._timeout
        logger.info("agent.sweep_grace", extra={"until": self.until.isoformat()})

    def within(self, now: datetime) -> bool:
        """Whether no agent may be declared lost at `now`."""
        return self.until is not None and now < self.until
