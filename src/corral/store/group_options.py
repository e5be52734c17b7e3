"""Every resource group's stored options, read at most once per `GROUP_OPTIONS_TTL_S`.

The scheduling pass and every lifecycle run need the groups' options (scheduling policy, phase
limits): on PostgreSQL at 100 submissions/s that was four statements on the path of each
session, each a round trip, for rows that change when an administrator edits a group. So they
are kept per `Database` for a short while. A change made through `resource_group_store` in this
process is seen at once (it forgets the cache after its commit); one made by another manager
when its event reaches this one (the manager's watcher, `infra.events.forget_on_events`), and
within `GROUP_OPTIONS_TTL_S` at the latest, should the event be lost.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store._direct import DirectStatement
from corral.store.database import Database
from corral.store.tables import resource_groups

GROUP_OPTIONS_TTL_S = 2.0

GroupOptions = Mapping[str, Mapping[str, Any]]  # group name -> its stored options

_ALL = DirectStatement(
    lambda _dialect: sa.select(resource_groups.c.name, resource_groups.c.options)
)


@dataclass(slots=True)
class _Cache:
    generation: int = 0  # bumped by every forget, so a read that began before one is not kept
    options: GroupOptions | None = None
    read_at: float = 0.0


_CACHES: weakref.WeakKeyDictionary[Database, _Cache] = weakref.WeakKeyDictionary()


async def group_options(
    db: Database, conn: AsyncConnection, *, clock: Callable[[], float] = time.monotonic
) -> GroupOptions:
    """Every group's options by name, read on `conn` unless a recent enough read is kept."""
    cache = _CACHES.get(db)
    if cache is None:
        cache = _CACHES[db] = _Cache()
    now = clock()
    if cache.options is not None and now - cache.read_at < GROUP_OPTIONS_TTL_S:
        return cache.options
    generation = cache.generation
    options = {name: dict(stored or {}) for name, stored in await _ALL.rows(conn)}
    if cache.generation == generation:
        cache.options, cache.read_at = options, now
    return options


async def group_options_naming(
    db: Database, conn: AsyncConnection, groups: Collection[str]
) -> GroupOptions:
    """`group_options`, read afresh when the kept read lacks one of `groups`.

    A group created a moment ago (by another manager) is so found before it is called unknown;
    a group that really does not exist costs one read each time it is asked for.
    """
    options = await group_options(db, conn)
    if not options.keys() >= set(groups):
        forget_group_options(db)
        options = await group_options(db, conn)
    return options


def forget_group_options(db: Database) -> None:
    """Drop what is kept for `db`: a group was created, changed or deleted."""
    cache = _CACHES.get(db)
    if cache is not None:
        cache.generation += 1
        cache.options = None
