"""The cache of every resource group's options, on both backends."""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass

import pytest
import sqlalchemy as sa

from corral.domain.resource_group import ResourceGroupOptions
from corral.infra.events import forget_on_events, open_event_bus
from corral.store.database import Database
from corral.store.group_options import GROUP_OPTIONS_TTL_S, forget_group_options, group_options
from corral.store.resource_group_store import (
    GROUP_CHANGES,
    create_group,
    delete_group,
    update_group,
)
from corral.store.scheduling import UnknownResourceGroupError, read_group_options
from corral.store.tables import resource_groups
from tests.integration._polling import eventually
from tests.integration.store._factories import NOW


@dataclass
class Ticks:
    """An injected monotonic clock."""

    now: float = 1_000.0

    def __call__(self) -> float:
        return self.now


async def options_of(db: Database, group: str, clock: Ticks) -> object:
    async with db.read_statements() as conn:
        return (await group_options(db, conn, clock=clock)).get(group)


async def write_behind_the_cache(db: Database, group: str, options: dict[str, object]) -> None:
    """Change a group's options the way another manager would: not through this process."""
    async with db.transaction() as conn:
        await conn.execute(
            resource_groups.update().where(resource_groups.c.name == group).values(options=options)
        )


async def test_a_read_is_kept_for_the_ttl_then_read_again(db: Database) -> None:
    """Another manager's change is seen once the kept read is older than the TTL, not before."""
    clock = Ticks()
    await create_group(db, "gpu", "", ResourceGroupOptions(), NOW)
    before = await options_of(db, "gpu", clock)
    await write_behind_the_cache(db, "gpu", {"max_sessions_per_owner": 3})
    clock.now += GROUP_OPTIONS_TTL_S / 2
    assert await options_of(db, "gpu", clock) == before
    clock.now += GROUP_OPTIONS_TTL_S
    assert await options_of(db, "gpu", clock) == {"max_sessions_per_owner": 3}


async def test_this_processs_own_changes_are_seen_at_once(db: Database) -> None:
    """create, update and delete through the store forget the kept read after their commit."""
    clock = Ticks()  # never advances: only forgetting can make a change visible
    assert await options_of(db, "gpu", clock) is None
    await create_group(db, "gpu", "", ResourceGroupOptions(), NOW)
    assert await options_of(db, "gpu", clock) is not None
    await update_group(db, "gpu", NOW, options_patch={"max_sessions_per_owner": 2})
    found = await options_of(db, "gpu", clock)
    assert isinstance(found, dict)
    assert found.get("max_sessions_per_owner") == 2
    await delete_group(db, "gpu", NOW)
    assert await options_of(db, "gpu", clock) is None


async def test_a_group_created_elsewhere_a_moment_ago_is_found(db: Database) -> None:
    """A group the kept read lacks is looked for again before it is called unknown."""
    async with db.read_statements() as conn:
        await group_options(db, conn)  # kept: no group "fresh" in it
    async with db.transaction() as conn:
        await conn.execute(
            sa.insert(resource_groups).values(name="fresh", options={}, created_at=NOW)
        )
    async with db.read_statements() as conn:
        assert await read_group_options(db, conn, "fresh") == {}
        with pytest.raises(UnknownResourceGroupError, match="'nowhere' does not exist"):
            await read_group_options(db, conn, "nowhere")


async def test_another_managers_change_is_seen_as_soon_as_its_event_arrives(
    db: Database, database_url: str
) -> None:
    """The manager's watcher forgets the kept options on a group event from any manager."""
    other = Database.open(database_url)  # another manager's pool on the same database
    bus = await open_event_bus("memory")
    clock = Ticks()  # never advances: only the watcher can make a change visible
    assert await options_of(db, "gpu", clock) is None  # kept, without the group
    await create_group(other, "gpu", "", ResourceGroupOptions(), NOW)
    forget = functools.partial(forget_group_options, db)
    watcher = asyncio.create_task(forget_on_events(bus, dict.fromkeys(GROUP_CHANGES, forget)))
    try:

        async def created() -> bool:
            return await options_of(db, "gpu", clock) is not None

        # Seen once the watcher subscribed: it forgets what it may have missed.
        await eventually(created, "the watcher to subscribe")
        _, events = await update_group(
            other, "gpu", NOW, options_patch={"max_sessions_per_owner": 4}
        )
        assert await options_of(db, "gpu", clock) == {}  # still the kept read
        await bus.publish(events)

        async def seen() -> bool:
            found = await options_of(db, "gpu", clock)
            return isinstance(found, dict) and found.get("max_sessions_per_owner") == 4

        await eventually(seen, "the other manager's change to be seen")
    finally:
        watcher.cancel()
        await bus.close()
        await other.close()
