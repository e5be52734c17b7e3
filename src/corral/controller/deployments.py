"""The mark side of deployments: create, scale and destroy write intent, set a hint, return.

The deployment coordinator does the rest (Mark-Execute): it creates and ends the replicas'
INFERENCE sessions through `SessionController`, like any session.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from corral.coordination.serving import DEPLOYMENT_CHANGED, DEPLOYMENT_ENTITY
from corral.coordination.serving_hints import ServingHint
from corral.domain.deployment import DEPLOYMENT_TOKEN_PREFIX, DeploymentAccess, DeploymentSpec
from corral.domain.events import Event
from corral.domain.record import record
from corral.domain.status import ENDPOINT_TRANSITIONS, EndpointLifecycle
from corral.domain.types import Clock, UserId, utcnow
from corral.infra.events import EventBus, publish_appended
from corral.infra.hints import HintBus
from corral.store.database import Database
from corral.store.deployments import (
    insert_deployment,
    move_deployments,
    read_deployments,
    set_desired_replicas,
    set_spec_in_place,
    set_token_hash,
    start_update,
)
from corral.store.events import append_events
from corral.store.tables import resource_groups
from corral.store.users import hash_secret

DEPLOYMENT_CREATED = "deployment.created"
DEPLOYMENT_SCALED = "deployment.scaled"
# An update that changed settings only (autoscaling, drain grace): the replicas stay.
DEPLOYMENT_SETTINGS_CHANGED = "deployment.settings_changed"
DEPLOYMENT_TOKEN_ROTATED = "deployment.token_rotated"
# Deployments a destroy request moves to DESTROYING.
_DESTROYABLE = ENDPOINT_TRANSITIONS.sources(EndpointLifecycle.DESTROYING)
# Deployments an update request moves to DEPLOYING.
_UPDATABLE = ENDPOINT_TRANSITIONS.sources(EndpointLifecycle.DEPLOYING)


class UnknownResourceGroupError(ValueError):
    """The deployment names a resource group that does not exist."""


class DeploymentEndedError(ValueError):
    """The deployment is being destroyed: it cannot be scaled."""


@record
class CreatedDeployment:
    """A deployment just written, and its token (only now in clear; None when open)."""

    id: uuid.UUID
    token: str | None


def new_deployment_token() -> str:
    """A fresh deployment token (its SHA-256 is what the database keeps)."""
    return DEPLOYMENT_TOKEN_PREFIX + secrets.token_urlsafe(32)


class DeploymentController:
    """Creates, scales and destroys deployments: mark in the database, set a hint, return."""

    def __init__(
        self, db: Database, hints: HintBus, events: EventBus | None = None, *, clock: Clock = utcnow
    ) -> None:
        self.db = db
        self.hints = hints
        self.events = events
        self.clock = clock
        self._notify = events.commit_channel if events is not None else None

    async def create(self, spec: DeploymentSpec, owner: UserId) -> CreatedDeployment:
        """Write the deployment as PENDING, with a new token when its access is by token;
        DeploymentNameTakenError if the owner has one of that name, UnknownResourceGroupError
        for a group that does not exist."""
        deployment_id = uuid.uuid4()
        token = new_deployment_token() if spec.access is DeploymentAccess.TOKEN else None
        now = self.clock()
        async with self.db.transaction() as conn:
            found = await conn.scalar(
                sa.select(resource_groups.c.name).where(
                    resource_groups.c.name == spec.resource_group
                )
            )
            if found is None:
                raise UnknownResourceGroupError(spec.resource_group)
            await insert_deployment(
                conn, deployment_id, spec, owner, now, None if token is None else hash_secret(token)
            )
            event = self._event(
                DEPLOYMENT_CREATED,
                deployment_id,
                owner,
                {"name": spec.name, "access": spec.access.value},
            )
            appended = await append_events(conn, [event], now, notify=self._notify)
        await self._after(appended, ServingHint.CHECK_PENDING)
        return CreatedDeployment(deployment_id, token)

    async def rotate_token(self, deployment: Mapping[str, Any]) -> str:
        """A new token for a deployment whose access is by token (the old one stops working
        once the proxies read the new route table); NotByTokenError for an open or destroyed
        one."""
        token = new_deployment_token()
        now = self.clock()
        async with self.db.transaction() as conn:
            if not await set_token_hash(conn, deployment["id"], hash_secret(token)):
                raise NotByTokenError(deployment["name"])
            event = self._event(
                DEPLOYMENT_TOKEN_ROTATED,
                deployment["id"],
                deployment["owner_id"],
                {"name": deployment["name"]},
            )
            appended = await append_events(conn, [event], now, notify=self._notify)
        # The route table carries the token's hash: publish it again.
        await self._after(appended, ServingHint.SYNC_DISCOVERY)
        return token

    async def scale(self, deployment: Mapping[str, Any], replicas: int) -> None:
        """Set a deployment's replica count; DeploymentEndedError once it is being destroyed."""
        now = self.clock()
        async with self.db.transaction() as conn:
            if not await set_desired_replicas(conn, deployment["id"], replicas):
                raise DeploymentEndedError(deployment["name"])
            event = self._event(
                DEPLOYMENT_SCALED,
                deployment["id"],
                deployment["owner_id"],
                {
                    "name": deployment["name"],
                    "from": deployment["desired_replicas"],
                    "to": replicas,
                },
            )
            appended = await append_events(conn, [event], now, notify=self._notify)
        await self._after(appended, ServingHint.CHECK_REPLICAS, ServingHint.SCALE)

    async def destroy(self, deployment: Mapping[str, Any]) -> bool:
        """Mark a deployment DESTROYING (its routes and sessions end, then it is DESTROYED);
        False when it was being destroyed already."""
        now = self.clock()
        async with self.db.transaction() as conn:
            current = await read_deployments(conn, ids=[deployment["id"]])
            source = EndpointLifecycle(current[0]["lifecycle"]) if current else None
            if source is None or source not in _DESTROYABLE:
                return False
            moved = await move_deployments(
                conn, [deployment["id"]], {source}, EndpointLifecycle.DESTROYING, now
            )
            if not moved:
                return False
            event = self._event(
                DEPLOYMENT_CHANGED,
                deployment["id"],
                deployment["owner_id"],
                {
                    "name": deployment["name"],
                    "from": source.value,
                    "to": EndpointLifecycle.DESTROYING.value,
                    "phase": "destroy request",
                    "result": "SUCCESS",
                },
            )
            appended = await append_events(conn, [event], now, notify=self._notify)
        await self._after(appended, ServingHint.DESTROY)
        return True

    async def update(self, deployment: Mapping[str, Any], spec: DeploymentSpec) -> int:
        """Start a rolling update to `spec` (DEPLOYING); its revision. UpdateInProgressError
        while an update runs or the deployment is being destroyed."""
        now = self.clock()
        source = EndpointLifecycle(deployment["lifecycle"])
        old = DeploymentSpec.model_validate(deployment["replica_spec"])
        if spec.replica_spec() == old.replica_spec():
            return await self._change_settings(deployment, old, spec)
        if source not in _UPDATABLE:
            raise UpdateInProgressError(deployment["name"])
        async with self.db.transaction() as conn:
            revision = await start_update(conn, deployment["id"], {source}, spec, now)
            if revision is None:
                raise UpdateInProgressError(deployment["name"])
            event = self._event(
                DEPLOYMENT_CHANGED,
                deployment["id"],
                deployment["owner_id"],
                {
                    "name": deployment["name"],
                    "from": source.value,
                    "to": EndpointLifecycle.DEPLOYING.value,
                    "phase": "update request",
                    "result": "SUCCESS",
                    "revision": revision,
                },
            )
            appended = await append_events(conn, [event], now, notify=self._notify)
        await self._after(appended, ServingHint.DEPLOY)
        return revision

    async def _change_settings(
        self, deployment: Mapping[str, Any], old: DeploymentSpec, spec: DeploymentSpec
    ) -> int:
        """An update of settings only, written in place: no new revision, no replica replaced
        (the replica count follows new autoscaling bounds). UpdateInProgressError once the
        deployment is being destroyed."""
        now = self.clock()
        before, after = old.model_dump(mode="json"), spec.model_dump(mode="json")
        changed = sorted(k for k in after if after[k] != before.get(k))
        async with self.db.transaction() as conn:
            if not await set_spec_in_place(conn, deployment["id"], spec):
                raise UpdateInProgressError(deployment["name"])
            event = self._event(
                DEPLOYMENT_SETTINGS_CHANGED,
                deployment["id"],
                deployment["owner_id"],
                {"name": deployment["name"], "changed": changed, "replicas": spec.replicas},
            )
            appended = await append_events(conn, [event], now, notify=self._notify)
        await self._after(appended, ServingHint.CHECK_REPLICAS, ServingHint.AUTOSCALE)
        return int(deployment["revision"])

    def _event(
        self, kind: str, deployment_id: uuid.UUID, owner: uuid.UUID, payload: dict[str, Any]
    ) -> Event:
        return Event(
            kind=kind,
            entity_type=DEPLOYMENT_ENTITY,
            entity_id=str(deployment_id),
            owner_id=owner,
            payload=payload,
            created_at=self.clock(),
        )

    async def _after(self, appended: list[Event], *hints: str) -> None:
        await self.hints.set_after_commit(*hints)
        await publish_appended(self.events, appended)


class NotByTokenError(ValueError):
    """The deployment is open (or being destroyed): it has no token to rotate."""


class UpdateInProgressError(ValueError):
    """The deployment is being updated (or destroyed) already."""
