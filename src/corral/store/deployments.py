"""Deployments and their routes in the store: named reads, and status writes guarded by the
expected status and checked against the lifecycle tables before they reach the database."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.deployment import (
    ROUTE_CHANGED,
    ROUTE_ENTITY,
    ROUTE_TABLE_CHANGED,
    ROUTE_TABLE_ID,
    DeploymentAccess,
    DeploymentSpec,
)
from corral.domain.events import Event
from corral.domain.status import (
    ENDPOINT_TRANSITIONS,
    ROUTE_TRANSITIONS,
    EndpointLifecycle,
    RouteStatus,
)
from corral.store._direct import DirectStatement
from corral.store._sql import in_constants
from corral.store.events import append_events
from corral.store.serving_history import (
    HistoryEntry,
    delete_serving_history,
    record_route_history,
)
from corral.store.tables import deployments, events, kernels, routes, sessions, users

_DEPLOYMENT_COLUMNS = (
    deployments.c.id,
    deployments.c.name,
    deployments.c.owner_id,
    users.c.name.label("owner"),
    deployments.c.resource_group,
    deployments.c.lifecycle,
    deployments.c.replica_spec,
    deployments.c.desired_replicas,
    deployments.c.revision,
    deployments.c.previous_spec,
    deployments.c.autoscale_wanted,
    deployments.c.autoscale_since,
    deployments.c.access,
    deployments.c.lifecycle_changed_at,
    deployments.c.created_at,
)
_FROM = deployments.join(users, users.c.id == deployments.c.owner_id)
_ROUTE_COLUMNS = (
    routes.c.id,
    routes.c.deployment_id,
    routes.c.session_id,
    routes.c.status,
    routes.c.health_info,
    routes.c.consecutive_failures,
    routes.c.consecutive_successes,
    routes.c.probed_at,
    routes.c.revision,
    routes.c.traffic_weight,
    routes.c.host,
    routes.c.port,
    routes.c.drain_until,
    routes.c.status_changed_at,
    routes.c.created_at,
    sessions.c.status.label("session_status"),
)
# Deployments no longer served: the proxy forgets them, their tokens are not rotated.
_ENDED = [EndpointLifecycle.DESTROYING.value, EndpointLifecycle.DESTROYED.value]
_ROUTE_FROM = routes.outerjoin(sessions, sessions.c.id == routes.c.session_id)


def _stored_spec(spec: DeploymentSpec) -> dict[str, Any]:
    """The spec as `replica_spec` keeps it: without `access`, whose column is the truth."""
    return spec.model_dump(mode="json", exclude={"access"})


class DeploymentNameTakenError(ValueError):
    """The owner has a deployment of that name already (not destroyed)."""


async def insert_deployment(
    conn: AsyncConnection,
    deployment_id: uuid.UUID,
    spec: DeploymentSpec,
    owner_id: uuid.UUID,
    now: datetime,
    token_hash: str | None = None,
) -> None:
    """Write a new deployment as PENDING (with its token's hash when its access is by token);
    DeploymentNameTakenError when the name is in use.

    A destroyed deployment of the same name is removed first (with its routes and their
    history): its name is free again."""
    removed = await conn.execute(
        deployments.delete()
        .where(
            deployments.c.owner_id == owner_id,
            deployments.c.name == spec.name,
            deployments.c.lifecycle == EndpointLifecycle.DESTROYED.value,
        )
        .returning(deployments.c.id)
    )
    await delete_serving_history(conn, [row.id for row in removed])
    try:
        async with conn.begin_nested():
            await conn.execute(
                deployments.insert().values(
                    id=deployment_id,
                    name=spec.name,
                    owner_id=owner_id,
                    resource_group=spec.resource_group,
                    lifecycle=ENDPOINT_TRANSITIONS.initial.value,
                    replica_spec=_stored_spec(spec),
                    desired_replicas=spec.replicas,
                    access=spec.access.value,
                    token_hash=token_hash,
                    lifecycle_changed_at=now,
                    created_at=now,
                )
            )
    except sa.exc.IntegrityError as exc:
        raise DeploymentNameTakenError(spec.name) from exc


async def read_deployments(
    conn: AsyncConnection,
    *,
    owner_id: uuid.UUID | None = None,
    ids: Collection[uuid.UUID] | None = None,
    name: str | None = None,
) -> list[dict[str, Any]]:
    """Deployments (with their owner's name), oldest first, filtered as asked (by lifecycle:
    `read_deployments_in`)."""
    query = sa.select(*_DEPLOYMENT_COLUMNS).select_from(_FROM)
    if owner_id is not None:
        query = query.where(deployments.c.owner_id == owner_id)
    if ids is not None:
        query = query.where(deployments.c.id.in_(list(ids)))
    if name is not None:
        query = query.where(deployments.c.name == name)
    rows = await conn.execute(query.order_by(deployments.c.created_at, deployments.c.id))
    return [dict(row._mapping) for row in rows]


async def read_deployments_in(
    conn: AsyncConnection, lifecycles: Collection[EndpointLifecycle]
) -> list[dict[str, Any]]:
    """The deployments in `lifecycles`, as `read_deployments` gives them; a statement built
    once per set of lifecycles: each deployment handler reads its targets so every run."""
    statement = _deployments_in(frozenset(s.value for s in lifecycles))
    return [row._asdict() for row in await statement.rows(conn)]


@functools.cache
def _deployments_in(lifecycles: frozenset[str]) -> DirectStatement:
    return DirectStatement(
        lambda _dialect: (
            sa.select(*_DEPLOYMENT_COLUMNS)
            .select_from(_FROM)
            .where(in_constants(deployments.c.lifecycle, sorted(lifecycles)))
            .order_by(deployments.c.created_at, deployments.c.id)
        )
    )


async def set_token_hash(conn: AsyncConnection, deployment_id: uuid.UUID, token_hash: str) -> bool:
    """Replace the token of a deployment whose access is by token and that is not being
    destroyed; False if there is none such."""
    done = await conn.execute(
        deployments.update()
        .where(
            deployments.c.id == deployment_id,
            deployments.c.access == DeploymentAccess.TOKEN.value,
            deployments.c.lifecycle.not_in(_ENDED),
        )
        .values(token_hash=token_hash)
    )
    return bool(done.rowcount)


async def read_routes(
    conn: AsyncConnection,
    *,
    deployment_ids: Collection[uuid.UUID] | None = None,
    statuses: Collection[RouteStatus] | None = None,
) -> list[dict[str, Any]]:
    """Routes with their session's status (`session_status`), oldest first."""
    query = sa.select(*_ROUTE_COLUMNS).select_from(_ROUTE_FROM)
    if deployment_ids is not None:
        query = query.where(routes.c.deployment_id.in_(list(deployment_ids)))
    if statuses is not None:
        query = query.where(routes.c.status.in_([s.value for s in statuses]))
    rows = await conn.execute(query.order_by(routes.c.created_at, routes.c.id))
    return [dict(row._mapping) for row in rows]


def routes_by_deployment(
    rows: Iterable[Mapping[str, Any]],
) -> dict[uuid.UUID, list[dict[str, Any]]]:
    """Route rows grouped by their deployment."""
    grouped: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row["deployment_id"], []).append(dict(row))
    return grouped


async def set_desired_replicas(
    conn: AsyncConnection, deployment_id: uuid.UUID, replicas: int
) -> bool:
    """Change the replica count of a deployment not being destroyed; False if it is."""
    ending = (EndpointLifecycle.DESTROYING.value, EndpointLifecycle.DESTROYED.value)
    result = await conn.execute(
        deployments.update()
        .where(deployments.c.id == deployment_id, deployments.c.lifecycle.not_in(ending))
        .values(desired_replicas=replicas)
    )
    return bool(result.rowcount)


async def set_spec_in_place(
    conn: AsyncConnection, deployment_id: uuid.UUID, spec: DeploymentSpec
) -> bool:
    """Write a spec whose replicas run as before (only settings changed: autoscaling, the
    drain grace, max_unavailable) without a new revision, on a deployment not being destroyed;
    False if it is. A pending autoscaling recommendation is dropped (its bounds may differ)."""
    ending = (EndpointLifecycle.DESTROYING.value, EndpointLifecycle.DESTROYED.value)
    result = await conn.execute(
        deployments.update()
        .where(deployments.c.id == deployment_id, deployments.c.lifecycle.not_in(ending))
        .values(
            replica_spec=spec.model_dump(mode="json"),
            desired_replicas=spec.replicas,
            autoscale_wanted=None,
            autoscale_since=None,
        )
    )
    return bool(result.rowcount)


async def set_autoscale_state(
    conn: AsyncConnection,
    deployment_id: uuid.UUID,
    *,
    expected: int,
    replicas: int,
    wanted: int | None,
    since: datetime | None,
) -> bool:
    """The autoscaler's write on a READY deployment still at `expected` replicas (a user's
    scale or another manager's run meanwhile wins): its replica count and its pending
    recommendation. False if the deployment changed."""
    result = await conn.execute(
        deployments.update()
        .where(
            deployments.c.id == deployment_id,
            deployments.c.lifecycle == EndpointLifecycle.READY.value,
            deployments.c.desired_replicas == expected,
        )
        .values(desired_replicas=replicas, autoscale_wanted=wanted, autoscale_since=since)
    )
    return bool(result.rowcount)


async def move_deployments(
    conn: AsyncConnection,
    ids: Collection[uuid.UUID],
    sources: Collection[EndpointLifecycle],
    target: EndpointLifecycle,
    now: datetime,
) -> list[uuid.UUID]:
    """Move the deployments still in one of `sources` to `target`; the ids moved.

    Checked against EndpointLifecycle's table first (IllegalTransitionError)."""
    ENDPOINT_TRANSITIONS.check(sources, target)
    if not ids:
        return []
    moved = await conn.execute(
        deployments.update()
        .where(
            deployments.c.id.in_(list(ids)),
            deployments.c.lifecycle.in_([s.value for s in sources]),
        )
        .values(lifecycle=target.value, lifecycle_changed_at=now)
        .returning(deployments.c.id)
    )
    return [row.id for row in moved]


async def insert_routes(
    conn: AsyncConnection,
    new: Sequence[tuple[uuid.UUID, uuid.UUID, uuid.UUID | None]],
    now: datetime,
    revision: int = 0,
) -> None:
    """Write routes as PROVISIONING: (route id, deployment id, session id or None) each."""
    if not new:
        return
    await conn.execute(
        routes.insert(),
        [
            {
                "id": route_id,
                "deployment_id": deployment_id,
                "session_id": session_id,
                "status": ROUTE_TRANSITIONS.initial.value,
                "consecutive_failures": 0,
                "traffic_weight": 100,
                "revision": revision,
                "status_changed_at": now,
                "created_at": now,
            }
            for route_id, deployment_id, session_id in new
        ],
    )


async def move_routes(
    conn: AsyncConnection,
    ids: Collection[uuid.UUID],
    sources: Collection[RouteStatus],
    target: RouteStatus,
    now: datetime,
    **values: Any,
) -> list[uuid.UUID]:
    """Move the routes still in one of `sources` to `target` (setting `values` too); the ids
    moved. Checked against RouteStatus's table first (IllegalTransitionError)."""
    ROUTE_TRANSITIONS.check(sources, target)
    if not ids:
        return []
    moved = await conn.execute(
        routes.update()
        .where(routes.c.id.in_(list(ids)), routes.c.status.in_([s.value for s in sources]))
        .values(status=target.value, status_changed_at=now, **values)
        .returning(routes.c.id)
    )
    return [row.id for row in moved]


async def set_route_sessions(
    conn: AsyncConnection, sessions_of: Mapping[uuid.UUID, uuid.UUID]
) -> None:
    """Record each route's replica session (only where none is recorded yet)."""
    for route_id, session_id in sessions_of.items():
        await conn.execute(
            routes.update()
            .where(routes.c.id == route_id, routes.c.session_id.is_(None))
            .values(session_id=session_id)
        )


async def update_routes(
    conn: AsyncConnection, values: Mapping[uuid.UUID, Mapping[str, Any]]
) -> None:
    """Write columns of routes (probe counters, addresses) whatever their status."""
    for route_id, columns in values.items():
        if columns:
            await conn.execute(routes.update().where(routes.c.id == route_id).values(**columns))


async def read_route_targets(
    conn: AsyncConnection, statuses: Collection[RouteStatus]
) -> list[dict[str, Any]]:
    """Routes in `statuses` with what their handlers look at: the session's status, its main
    kernel's runtime info, the deployment's spec and owner. A statement built once per set of
    statuses: each route handler reads its targets so every run."""
    statement = _route_targets_in(frozenset(s.value for s in statuses))
    return [row._asdict() for row in await statement.rows(conn)]


@functools.cache
def _route_targets_in(statuses: frozenset[str]) -> DirectStatement:
    return DirectStatement(lambda _dialect: _route_targets(sorted(statuses)))


def _route_targets(statuses: Sequence[str]) -> sa.Select[Any]:
    return (
        sa.select(
            *_ROUTE_COLUMNS,
            deployments.c.name.label("deployment_name"),
            deployments.c.lifecycle.label("deployment_lifecycle"),
            deployments.c.owner_id,
            deployments.c.replica_spec,
            deployments.c.access,
            deployments.c.token_hash,
            kernels.c.runtime_info,
            kernels.c.status_changed_at.label("kernel_changed_at"),
        )
        .select_from(
            _ROUTE_FROM.join(deployments, deployments.c.id == routes.c.deployment_id).outerjoin(
                kernels,
                sa.and_(kernels.c.session_id == routes.c.session_id, kernels.c.cluster_index == 0),
            )
        )
        .where(in_constants(routes.c.status, statuses))
        .order_by(routes.c.created_at, routes.c.id)
    )


async def read_route_table(conn: AsyncConnection) -> tuple[int, list[dict[str, Any]]]:
    """The healthy routes of every deployment not destroyed (deployment id, name, owner,
    access, token hash, host, port), and the table's revision: the id of its latest change
    event (0: none yet)."""
    query = (
        sa.select(
            routes.c.deployment_id,
            deployments.c.name,
            users.c.name.label("owner"),
            deployments.c.access,
            deployments.c.token_hash,
            routes.c.host,
            routes.c.port,
        )
        .select_from(routes.join(_FROM, deployments.c.id == routes.c.deployment_id))
        .where(
            routes.c.status == RouteStatus.HEALTHY.value,
            deployments.c.lifecycle.not_in(_ENDED),
        )
        .order_by(deployments.c.created_at, routes.c.created_at)
    )
    rows = [dict(row._mapping) for row in await conn.execute(query)]
    revision = await conn.scalar(
        sa.select(sa.func.max(events.c.id)).where(
            events.c.entity_id == ROUTE_TABLE_ID, events.c.kind == ROUTE_TABLE_CHANGED
        )
    )
    return int(revision or 0), rows


async def end_routes(
    conn: AsyncConnection,
    deployment: Mapping[str, Any],
    ending: Sequence[Mapping[str, Any]],
    phase: str,
    reason: str,
    now: datetime,
    *,
    notify: str | None,
    drain_until: datetime | None = None,
) -> list[Event]:
    """Move `ending` (routes of `deployment`) to TERMINATING, each from the status it was read
    in, with a `route.status_changed` event and a history row per route moved; the events
    appended. With `drain_until`, a HEALTHY route drains: it leaves the route table at once,
    and its session ends when its requests in flight have (TerminatingRoute), at the latest
    then."""
    moved: list[Event] = []
    history: list[HistoryEntry] = []
    for route in ending:
        source = RouteStatus(route["status"])
        draining = drain_until if source is RouteStatus.HEALTHY else None
        said = reason if draining is None else f"{reason}; draining"
        if await move_routes(
            conn, [route["id"]], {source}, RouteStatus.TERMINATING, now, drain_until=draining
        ):
            history.append(
                HistoryEntry(
                    route["id"], source.value, RouteStatus.TERMINATING.value, said, deployment["id"]
                )
            )
            moved.append(
                Event(
                    kind=ROUTE_CHANGED,
                    entity_type=ROUTE_ENTITY,
                    entity_id=str(route["id"]),
                    owner_id=deployment["owner_id"],
                    payload={
                        "from": source.value,
                        "to": RouteStatus.TERMINATING.value,
                        "phase": phase,
                        "result": "SUCCESS",
                        "reason": said,
                        "deployment_id": str(deployment["id"]),
                        "deployment": deployment["name"],
                    },
                    created_at=now,
                )
            )
    await record_route_history(conn, history, phase=phase, result="SUCCESS", now=now)
    return await append_events(conn, moved, now, notify=notify)


async def start_update(
    conn: AsyncConnection,
    deployment_id: uuid.UUID,
    sources: Collection[EndpointLifecycle],
    spec: DeploymentSpec,
    now: datetime,
) -> int | None:
    """Start a rolling update to `spec` of a deployment in `sources`: the spec's next revision
    (the one replaced kept to roll back to), DEPLOYING. The new revision; None if not moved."""
    ENDPOINT_TRANSITIONS.check(sources, EndpointLifecycle.DEPLOYING)
    moved = await conn.execute(
        deployments.update()
        .where(
            deployments.c.id == deployment_id,
            deployments.c.lifecycle.in_([s.value for s in sources]),
        )
        .values(
            previous_spec=deployments.c.replica_spec,
            replica_spec=_stored_spec(spec),
            desired_replicas=spec.replicas,
            revision=deployments.c.revision + 1,
            lifecycle=EndpointLifecycle.DEPLOYING.value,
            lifecycle_changed_at=now,
        )
        .returning(deployments.c.revision)
    )
    row = moved.first()
    return None if row is None else int(row.revision)


async def roll_back(conn: AsyncConnection, deployment: Mapping[str, Any]) -> int:
    """Go back to the spec an update replaced, as a new revision that the replicas still
    running it carry from now on; the new revision."""
    revision = int(deployment["revision"]) + 1
    await conn.execute(
        deployments.update()
        .where(
            deployments.c.id == deployment["id"], deployments.c.revision == deployment["revision"]
        )
        .values(replica_spec=deployment["previous_spec"], previous_spec=None, revision=revision)
    )
    old = [r["id"] for r in deployment["routes"] if r["revision"] != deployment["revision"]]
    if old:
        await conn.execute(routes.update().where(routes.c.id.in_(old)).values(revision=revision))
    return revision
