"""Resource groups: created, listed, their options changed and the groups deleted by admins.

Options are stored as the admin wrote them (validated, defaults left out), so a default that
changes in a later corral version applies to every group that did not choose otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.events import Event
from corral.domain.record import record
from corral.domain.resource_group import ResourceGroupOptions
from corral.domain.status import SESSION_NON_TERMINAL
from corral.store.agent_registry import AGENT_TERMINATED
from corral.store.database import Database
from corral.store.events import append_events
from corral.store.group_options import forget_group_options
from corral.store.scheduling import UnknownResourceGroupError
from corral.store.tables import agents, resource_groups, sessions

DEFAULT_GROUP = "default"  # every agent and session joins it unless told otherwise
GROUP_CREATED = "resource_group.created"
GROUP_UPDATED = "resource_group.updated"
GROUP_DELETED = "resource_group.deleted"
GROUP_CHANGES = (GROUP_CREATED, GROUP_UPDATED, GROUP_DELETED)

__all__ = [
    "DEFAULT_GROUP",
    "ResourceGroupExistsError",
    "ResourceGroupInUseError",
    "ResourceGroupRecord",
    "UnknownResourceGroupError",
    "create_group",
    "delete_group",
    "drop_allowed_user",
    "get_group",
    "list_groups",
    "merge_patch",
    "stored_options",
    "update_group",
]


class ResourceGroupExistsError(ValueError):
    """A resource group with this name exists already."""


class ResourceGroupInUseError(ValueError):
    """The group cannot be deleted: `reason` is a stable slug, the message says what to do."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@record
class ResourceGroupRecord:
    """A resource group with its options as stored (see `ResourceGroupOptions`)."""

    name: str
    description: str
    options: dict[str, Any]
    created_at: datetime


def stored_options(options: ResourceGroupOptions) -> dict[str, Any]:
    """What is stored for validated options: the fields that were given, as JSON values."""
    return options.model_dump(mode="json", exclude_unset=True)


def merge_patch(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`target` with `patch` applied as a JSON merge patch (RFC 7396): null removes a key."""
    merged = dict(target)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge_patch(merged[key], value)
        else:
            merged[key] = value
    return merged


_COLUMNS = (
    resource_groups.c.name,
    resource_groups.c.description,
    resource_groups.c.options,
    resource_groups.c.created_at,
)


async def list_groups(
    db: Database, *, after_name: str | None = None, limit: int = 100
) -> list[ResourceGroupRecord]:
    """Up to `limit` groups with names after `after_name`, by name."""
    query = sa.select(*_COLUMNS).order_by(resource_groups.c.name).limit(limit)
    if after_name is not None:
        query = query.where(resource_groups.c.name > after_name)
    async with db.read() as conn:
        return [_record(row) for row in await conn.execute(query)]


async def get_group(db: Database, name: str) -> ResourceGroupRecord | None:
    """One group (None: no such group)."""
    async with db.read() as conn:
        row = (
            await conn.execute(sa.select(*_COLUMNS).where(resource_groups.c.name == name))
        ).first()
    return None if row is None else _record(row)


async def create_group(
    db: Database, name: str, description: str, options: ResourceGroupOptions, now: datetime
) -> tuple[ResourceGroupRecord, list[Event]]:
    """A new group and the event recording it; ResourceGroupExistsError if the name is taken."""
    record = ResourceGroupRecord(name, description, stored_options(options), now)
    try:
        async with db.transaction() as conn:
            await conn.execute(
                resource_groups.insert().values(
                    name=name, description=description, options=record.options, created_at=now
                )
            )
            events = await _append(conn, GROUP_CREATED, record, now)
    except sa.exc.IntegrityError as exc:
        raise ResourceGroupExistsError(f"a resource group named {name!r} exists already") from exc
    forget_group_options(db)
    return record, events


async def update_group(
    db: Database,
    name: str,
    now: datetime,
    *,
    description: str | None = None,
    options_patch: Mapping[str, Any] | None = None,
) -> tuple[ResourceGroupRecord, list[Event]]:
    """Change a group's description and merge `options_patch` into its options.

    The merged options are validated as a whole (pydantic's ValidationError if they are not
    valid, nothing written); UnknownResourceGroupError if there is no such group.
    """
    async with db.transaction() as conn:
        row = await _lock_group(conn, name)
        current = _record(row)
        options = current.options
        if options_patch is not None:
            merged = merge_patch(options, options_patch)
            options = stored_options(ResourceGroupOptions.model_validate(merged))
        record = ResourceGroupRecord(
            name, current.description if description is None else description, options, row[3]
        )
        await conn.execute(
            resource_groups.update()
            .where(resource_groups.c.name == name)
            .values(description=record.description, options=record.options)
        )
        events = await _append(conn, GROUP_UPDATED, record, now)
    forget_group_options(db)
    return record, events


async def _lock_group(conn: AsyncConnection, name: str) -> Any:
    """The group's row, locked for this transaction (UnknownResourceGroupError if none)."""
    row = (
        await conn.execute(
            sa.select(*_COLUMNS).where(resource_groups.c.name == name).with_for_update()
        )
    ).first()
    if row is None:
        raise UnknownResourceGroupError(f"resource group {name!r} does not exist")
    return row


async def delete_group(db: Database, name: str, now: datetime) -> list[Event]:
    """Delete an unused group; the event recording it.

    Refused (ResourceGroupInUseError) for the default group, a group with agents that are not
    TERMINATED or with sessions that have not ended, and a group that finished sessions or
    terminated agents still name (their records keep it).
    """
    if name == DEFAULT_GROUP:
        raise ResourceGroupInUseError(
            "resource-group-protected",
            f"resource group {DEFAULT_GROUP!r} cannot be deleted: agents and sessions join it "
            "unless told otherwise; change its options instead",
        )
    try:
        async with db.transaction() as conn:
            row = await _lock_group(conn, name)
            await _refuse_if_used(conn, name)
            await conn.execute(resource_groups.delete().where(resource_groups.c.name == name))
            events = await _append(conn, GROUP_DELETED, _record(row), now)
    except sa.exc.IntegrityError as exc:
        raise ResourceGroupInUseError(
            "resource-group-in-use",
            f"resource group {name!r} is still named by terminated agents, finished sessions "
            "or deployments, whose records keep it; leave the group in place (nothing is "
            "scheduled to a group without agents)",
        ) from exc
    forget_group_options(db)
    return events


async def drop_allowed_user(conn: AsyncConnection, user: str, now: datetime) -> list[Event]:
    """Take `user` off every group's `allowed_users`, in the caller's transaction (a user being
    removed: a later user of the same name must not inherit their access); the events of the
    groups changed. The caller forgets the kept options after its commit."""
    rows = await conn.execute(sa.select(*_COLUMNS).with_for_update())
    events: list[Event] = []
    for row in rows.all():
        current = _record(row)
        listed = current.options.get("allowed_users")
        if not isinstance(listed, list) or user not in listed:
            continue
        options = {**current.options, "allowed_users": [n for n in listed if n != user]}
        await conn.execute(
            resource_groups.update()
            .where(resource_groups.c.name == current.name)
            .values(options=options)
        )
        changed = ResourceGroupRecord(
            current.name, current.description, options, current.created_at
        )
        events += await _append(conn, GROUP_UPDATED, changed, now)
    return events


async def _refuse_if_used(conn: AsyncConnection, name: str) -> None:
    live_agents = await conn.scalar(
        sa.select(sa.func.count()).where(
            agents.c.resource_group == name, agents.c.status != AGENT_TERMINATED
        )
    )
    if live_agents:
        raise ResourceGroupInUseError(
            "resource-group-has-agents",
            f"resource group {name!r} has {live_agents} agent(s); stop them or register them "
            "with another resource group first",
        )
    live_sessions = await conn.scalar(
        sa.select(sa.func.count()).where(
            sessions.c.resource_group == name,
            sessions.c.status.in_([s.value for s in SESSION_NON_TERMINAL]),
        )
    )
    if live_sessions:
        raise ResourceGroupInUseError(
            "resource-group-has-sessions",
            f"resource group {name!r} has {live_sessions} session(s) that have not ended; "
            "terminate them or wait until they end",
        )


async def _append(
    conn: AsyncConnection, kind: str, record: ResourceGroupRecord, now: datetime
) -> list[Event]:
    event = Event(
        kind=kind,
        entity_type="resource_group",
        entity_id=record.name,
        payload={"description": record.description, "options": record.options},
        created_at=now,
    )
    return await append_events(conn, [event], now)


def _record(row: Any) -> ResourceGroupRecord:
    return ResourceGroupRecord(row[0], row[1], dict(row[2] or {}), row[3])
