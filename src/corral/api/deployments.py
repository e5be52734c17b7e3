"""`/v1/deployments`: create, list, inspect (with routes and their health), scale and destroy
model-serving deployments.

A user sees and acts on only their own deployments (another user's answers 404); admins see
all. A deployment is named by its id or, among its owner's, by its name. Every call only marks:
the deployment and route coordinators do the rest.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime
from typing import Annotated, Any

import pydantic
from fastapi import APIRouter, Path, Request
from pydantic import BaseModel

from corral.api.auth import AdminUser, CurrentUser, Db
from corral.api.problems import Problem, invalid_request
from corral.controller.deployments import (
    DeploymentController,
    DeploymentEndedError,
    NotByTokenError,
    UnknownResourceGroupError,
    UpdateInProgressError,
)
from corral.domain.bounds import NAME_PATTERN
from corral.domain.deployment import (
    Autoscaling,
    DeploymentAccess,
    DeploymentScale,
    DeploymentSpec,
    DeploymentUpdate,
    HealthCheck,
)
from corral.domain.field_errors import field_errors
from corral.domain.status import ROUTE_LIVE, EndpointLifecycle, RouteStatus
from corral.store.database import Database
from corral.store.deployments import (
    DeploymentNameTakenError,
    read_deployments,
    read_route_table,
    read_routes,
    routes_by_deployment,
)
from corral.store.proxy_reports import read_proxy_load, write_proxy_report
from corral.store.serving_history import read_deployment_history, read_route_history
from corral.store.users import Principal

router = APIRouter(prefix="/v1/deployments", tags=["deployments"])
_NAME_RE = re.compile(NAME_PATTERN)

DeploymentRef = Annotated[
    str, Path(min_length=1, max_length=64, description="the deployment's name or id")
]


class RouteOut(BaseModel):
    """One replica of a deployment."""

    id: uuid.UUID
    session_id: uuid.UUID | None
    session_status: str | None
    status: RouteStatus
    host: str | None
    port: int | None
    health_info: str | None
    consecutive_failures: int
    consecutive_successes: int
    revision: int  # the deployment's spec revision this replica runs
    probed_at: datetime | None  # the last health probe (None: not probed yet)
    traffic_weight: int
    # Taken out and draining (no new requests) until its requests end or this time.
    drain_until: datetime | None = None
    status_changed_at: datetime
    created_at: datetime


class DeploymentOut(BaseModel):
    """A deployment as users see it; `routes` only when read alone."""

    id: uuid.UUID
    name: str
    owner: str
    lifecycle: EndpointLifecycle
    lifecycle_changed_at: datetime
    created_at: datetime
    resource_group: str
    replicas: int  # desired
    revision: int  # of the spec; a rolling update makes the next
    live_replicas: int  # routes coming up or serving
    healthy_replicas: int
    image: str
    command: list[str]
    health_check: HealthCheck
    drain_grace_s: float
    autoscaling: Autoscaling | None
    # The autoscaler's pending recommendation and since when (None: none pending).
    autoscale_wanted: int | None
    autoscale_since: datetime | None
    access: DeploymentAccess  # who the proxy lets through: anyone, or holders of its token
    routes: list[RouteOut] | None = None


class DeploymentCreated(DeploymentOut):
    """A deployment just created, with its token: shown this once (access by token only)."""

    token: str | None


class DeploymentToken(BaseModel):
    """A deployment's new token, shown this once; send it as `Authorization: Bearer TOKEN`."""

    token: str


class DeploymentList(BaseModel):
    """Deployments, oldest first."""

    items: list[DeploymentOut]


def _controller(request: Request) -> DeploymentController:
    controller: DeploymentController = request.app.state.deployments
    return controller


def _out(row: dict[str, Any], routes: list[dict[str, Any]], *, with_routes: bool) -> DeploymentOut:
    spec = row["replica_spec"]
    parsed = DeploymentSpec.model_validate(spec)
    return DeploymentOut(
        id=row["id"],
        name=row["name"],
        owner=row["owner"],
        lifecycle=row["lifecycle"],
        lifecycle_changed_at=row["lifecycle_changed_at"],
        created_at=row["created_at"],
        resource_group=row["resource_group"],
        replicas=row["desired_replicas"],
        revision=row["revision"],
        live_replicas=sum(RouteStatus(r["status"]) in ROUTE_LIVE for r in routes),
        healthy_replicas=sum(r["status"] == RouteStatus.HEALTHY.value for r in routes),
        image=spec["image"],
        command=spec["command"],
        health_check=parsed.health_check,
        drain_grace_s=parsed.drain_grace_s,
        autoscaling=parsed.autoscaling,
        autoscale_wanted=row["autoscale_wanted"],
        autoscale_since=row["autoscale_since"],
        access=row["access"],
        routes=[RouteOut.model_validate(r) for r in routes] if with_routes else None,
    )


async def _find(db: Database, user: Principal, ref: str) -> dict[str, Any]:
    """The deployment `ref` names among those `user` may see; 404 otherwise."""
    owner_id = None if user.is_admin else user.user_id
    found: list[dict[str, Any]] = []
    as_id = _as_uuid(ref)
    async with db.read() as conn:
        if as_id is not None:
            found = await read_deployments(conn, owner_id=owner_id, ids=[as_id])
        if not found and _NAME_RE.fullmatch(ref):
            # By name: the caller's own (an admin names another user's by its id).
            found = await read_deployments(conn, owner_id=user.user_id, name=ref)
    if not found:
        raise Problem(
            404,
            "deployment-not-found",
            "No such deployment",
            f"no deployment {ref!r} of yours; `corral deploy ls` lists them",
        )
    return found[-1]


def _as_uuid(ref: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(ref)
    except ValueError:
        return None


async def _with_routes(db: Database, row: dict[str, Any]) -> DeploymentOut:
    async with db.read() as conn:
        routes = await read_routes(conn, deployment_ids=[row["id"]])
    return _out(row, routes, with_routes=True)


@router.post(
    "", status_code=201, response_model=DeploymentCreated, operation_id="create_deployment"
)
async def create_deployment(
    spec: DeploymentSpec, user: CurrentUser, db: Db, request: Request
) -> DeploymentCreated:
    """Create a deployment (201): its replicas start as INFERENCE sessions, are probed, and
    are served under its name. With access by token (the default) the answer carries the
    deployment's token, shown this once."""
    try:
        spec.replica_spec()
    except pydantic.ValidationError as exc:
        raise invalid_request(field_errors(exc)) from None
    try:
        created = await _controller(request).create(spec, user.user_id)
    except DeploymentNameTakenError as exc:
        raise Problem(
            409,
            "deployment-name-taken",
            "Deployment name in use",
            f"you have a deployment named {spec.name!r} already; remove it "
            f"(`corral deploy rm {spec.name}`) or choose another name",
        ) from exc
    except UnknownResourceGroupError as exc:
        raise Problem(
            422,
            "validation-error",
            "The request is not valid",
            f"resource_group: no resource group {spec.resource_group!r}",
            errors=[{"field": "resource_group", "message": f"no resource group {exc}"}],
        ) from exc
    out = await _with_routes(db, await _find(db, user, str(created.id)))
    return DeploymentCreated(**out.model_dump(), token=created.token)


@router.get("", response_model=DeploymentList, operation_id="list_deployments")
async def list_deployments(user: CurrentUser, db: Db) -> DeploymentList:
    """Your deployments (admins: everyone's), oldest first, without their routes."""
    async with db.read() as conn:
        rows = await read_deployments(conn, owner_id=None if user.is_admin else user.user_id)
        grouped = routes_by_deployment(
            await read_routes(conn, deployment_ids=[r["id"] for r in rows]) if rows else []
        )
    return DeploymentList(
        items=[_out(r, grouped.get(r["id"], []), with_routes=False) for r in rows]
    )


@router.get("/{deployment}", response_model=DeploymentOut, operation_id="get_deployment")
async def get_deployment(deployment: DeploymentRef, user: CurrentUser, db: Db) -> DeploymentOut:
    """One deployment with its routes: each one's status, address and health."""
    return await _with_routes(db, await _find(db, user, deployment))


@router.post("/{deployment}/scale", response_model=DeploymentOut, operation_id="scale_deployment")
async def scale_deployment(
    deployment: DeploymentRef, body: DeploymentScale, user: CurrentUser, db: Db, request: Request
) -> DeploymentOut:
    """Change the replica count; replicas are added or taken out by the coordinator."""
    found = await _find(db, user, deployment)
    policy = DeploymentSpec.model_validate(found["replica_spec"]).autoscaling
    if policy is not None and policy.bounded(body.replicas) != body.replicas:
        raise Problem(
            422,
            "validation-error",
            "The request is not valid",
            f"replicas: must be within autoscaling's bounds ({policy.min_replicas}.."
            f"{policy.max_replicas}; got {body.replicas}); `corral deploy update` changes them",
            errors=[
                {
                    "field": "replicas",
                    "message": f"must be within {policy.min_replicas}..{policy.max_replicas}",
                }
            ],
        )
    try:
        await _controller(request).scale(found, body.replicas)
    except DeploymentEndedError as exc:
        raise Problem(
            409,
            "deployment-ended",
            "Deployment is being destroyed",
            f"deployment {found['name']!r} is {found['lifecycle']}; it cannot be scaled",
        ) from exc
    return await _with_routes(db, await _find(db, user, str(found["id"])))


@router.post("/{deployment}/update", response_model=DeploymentOut, operation_id="update_deployment")
async def update_deployment(
    deployment: DeploymentRef, body: DeploymentUpdate, user: CurrentUser, db: Db, request: Request
) -> DeploymentOut:
    """Roll out a new image, command or environment: new replicas become healthy before old
    ones are taken out; a new version that never serves is rolled back."""
    found = await _find(db, user, deployment)
    try:
        # The replica count as it is now (scaled, autoscaled), not as it was created.
        current = {**found["replica_spec"], "replicas": found["desired_replicas"]}
        spec = body.applied_to(DeploymentSpec.model_validate(current))
        spec.replica_spec()
    except pydantic.ValidationError as exc:
        raise invalid_request(field_errors(exc)) from None
    try:
        await _controller(request).update(found, spec)
    except UpdateInProgressError as exc:
        raise Problem(
            409,
            "deployment-busy",
            "Deployment is being updated or destroyed",
            f"deployment {found['name']!r} is {found['lifecycle']}; wait until it is ready",
        ) from exc
    return await _with_routes(db, await _find(db, user, str(found["id"])))


class ServingHistoryEntry(BaseModel):
    """One outcome of a deployment or route handler (spec document 1: SUCCESS / FAILURE for
    deployments, SUCCESS / FAILURE / STALE for routes); repeats are folded (`attempts`)."""

    route_id: uuid.UUID | None = None  # None: the deployment's own
    phase: str
    from_status: str | None
    to_status: str | None  # None: it stayed
    result: str
    message: str
    attempts: int
    created_at: datetime
    updated_at: datetime


class DeploymentHistory(BaseModel):
    """A deployment's handler history and its routes', each oldest first."""

    deployment: list[ServingHistoryEntry]
    routes: list[ServingHistoryEntry]


@router.get(
    "/{deployment}/history", response_model=DeploymentHistory, operation_id="get_deployment_history"
)
async def deployment_history(
    deployment: DeploymentRef, user: CurrentUser, db: Db
) -> DeploymentHistory:
    """What the deployment and route handlers did with the deployment and its replicas."""
    found = await _find(db, user, deployment)
    async with db.read() as conn:
        own = await read_deployment_history(conn, found["id"])
        of_routes = await read_route_history(conn, found["id"])
    return DeploymentHistory(
        deployment=[ServingHistoryEntry.model_validate(r) for r in own],
        routes=[ServingHistoryEntry.model_validate(r) for r in of_routes],
    )


@router.delete("/{deployment}", response_model=DeploymentOut, operation_id="destroy_deployment")
async def destroy_deployment(
    deployment: DeploymentRef, user: CurrentUser, db: Db, request: Request
) -> DeploymentOut:
    """Destroy a deployment: DESTROYING at once, DESTROYED once every replica has ended."""
    found = await _find(db, user, deployment)
    await _controller(request).destroy(found)
    return await _with_routes(db, await _find(db, user, str(found["id"])))


@router.post(
    "/{deployment}/token", response_model=DeploymentToken, operation_id="rotate_deployment_token"
)
async def rotate_deployment_token(
    deployment: DeploymentRef, user: CurrentUser, db: Db, request: Request
) -> DeploymentToken:
    """Give a deployment whose access is by token a new token (shown this once): the old one
    stops opening it within moments, once the proxies read the new route table."""
    found = await _find(db, user, deployment)
    try:
        token = await _controller(request).rotate_token(found)
    except NotByTokenError as exc:
        raise Problem(
            409,
            "deployment-not-by-token",
            "Deployment has no token",
            f"deployment {found['name']!r} is {found['access']} to anyone who reaches the proxy "
            f"(or being destroyed): it has no token to rotate",
        ) from exc
    return DeploymentToken(token=token)


serving_router = APIRouter(prefix="/v1/serving", tags=["deployments"])


class RouteTableEntry(BaseModel):
    """One deployment's healthy replicas, where a proxy sends its requests."""

    id: uuid.UUID
    name: str
    owner: str
    access: DeploymentAccess
    # The SHA-256 (hex) of the deployment's token, which the proxy asks for (access by token).
    token_hash: str | None
    addresses: list[str]  # host:port of each HEALTHY route


class RouteTable(BaseModel):
    """The healthy route table and its revision (the id of its latest change event)."""

    revision: int
    deployments: list[RouteTableEntry]


@serving_router.get("/routes", response_model=RouteTable, operation_id="get_route_table")
async def route_table(user: AdminUser, db: Db) -> RouteTable:
    """The healthy route table that proxies forward by (admins: a proxy runs with an admin's
    token)."""
    async with db.read() as conn:
        revision, rows = await read_route_table(conn)
    entries: dict[uuid.UUID, RouteTableEntry] = {}
    for row in rows:
        entry = entries.setdefault(
            row["deployment_id"],
            RouteTableEntry(
                id=row["deployment_id"],
                name=row["name"],
                owner=row["owner"],
                access=row["access"],
                token_hash=row["token_hash"],
                addresses=[],
            ),
        )
        entry.addresses.append(f"{row['host']}:{row['port']}")
    return RouteTable(revision=revision, deployments=list(entries.values()))


class ProxyReport(BaseModel):
    """A proxy's requests in flight per deployment id and replica address (host:port), and
    the route table revision it forwards by."""

    model_config = pydantic.ConfigDict(extra="forbid")

    proxy_id: str = pydantic.Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._:-]+$")
    table_revision: int = pydantic.Field(ge=0)
    inflight: dict[uuid.UUID, dict[str, Annotated[int, pydantic.Field(ge=0)]]] = pydantic.Field(
        default_factory=dict, max_length=10_000
    )


class ServingLoad(BaseModel):
    """The live proxies' reports, summed: requests in flight per deployment."""

    proxies: int
    inflight: dict[str, int]


@serving_router.post("/load", response_model=ServingLoad, operation_id="report_proxy_load")
async def report_proxy_load(
    body: ProxyReport, user: AdminUser, db: Db, request: Request
) -> ServingLoad:
    """A proxy reports its requests in flight (every second; admins: a proxy runs with an
    admin's token). The answer is the load summed over the live proxies."""
    now = _controller(request).clock()
    inflight = {str(d): by for d, by in body.inflight.items()}
    async with db.transaction() as conn:
        await write_proxy_report(conn, body.proxy_id, body.table_revision, inflight, now)
    async with db.read() as conn:
        load = await read_proxy_load(conn, now)
    return ServingLoad(
        proxies=load.proxies,
        inflight={d: sum(by.values()) for d, by in load.inflight.items()},
    )
