"""DeployingDeployment (beyond spec document 1's five; issue 38): a rolling update.

New replicas (the current revision) come up one at a time; an old one is taken out only
while the healthy replicas stay at `replicas - max_unavailable` or more. The update is done
(DEPLOYING → READY) when only current replicas run, `replicas` of them healthy. A replica of
the new version that ends (it failed to start, or was evicted as unhealthy) rolls the update
back: the old spec becomes current again (a new revision, carried by the old replicas still
running), and the new replicas are taken out the same way.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from corral.controller.sessions import SessionController
from corral.coordination.serving_hints import ServingHint
from corral.domain.deployment import DEPLOYMENT_ENTITY, DEPLOYMENT_ROLLED_BACK, DeploymentSpec
from corral.domain.events import Event
from corral.domain.serving import ServingHandlerResult, ServingTransitions
from corral.domain.status import ROUTE_LIVE, EndpointLifecycle, RouteStatus
from corral.handlers.deployments._replicas import (
    drain_deadline,
    drain_order,
    replica_routes,
    session_ended,
)
from corral.handlers.deployments.scaling import ScalingDeploymentHandler
from corral.handlers.serving_base import Target
from corral.infra.events import EventBus, publish_appended
from corral.store.database import Database
from corral.store.deployments import end_routes, insert_routes, roll_back
from corral.store.events import append_events

_E = EndpointLifecycle
DEPLOY_POLL_S = 0.5


def _ended_new(target: Target) -> list[Mapping[str, Any]]:
    """Replicas of the current revision that ended (or are ending) during the update."""
    return [
        r
        for r in target["routes"]
        if r["revision"] == target["revision"]
        and (RouteStatus(r["status"]) not in ROUTE_LIVE or session_ended(r))
    ]


class DeployingDeploymentHandler(ScalingDeploymentHandler):
    """Success (to READY) once the rollout (or the rollback) is complete; otherwise one step
    of it, and the deployment stays DEPLOYING."""

    # AUTOSCALE: a deployment READY again is the autoscaler's to look at.
    next_hints: ClassVar[frozenset[str]] = frozenset(
        {
            ServingHint.PROVISION_ROUTES,
            ServingHint.TERMINATE_ROUTES,
            ServingHint.SYNC_DISCOVERY,
            ServingHint.AUTOSCALE,
        }
    )

    def __init__(self, db: Database, sessions: SessionController, events: EventBus | None) -> None:
        super().__init__(db, sessions, events)

    @classmethod
    def name(cls) -> str:
        return "DeployingDeployment"

    @property
    def target_statuses(self) -> frozenset[EndpointLifecycle]:
        return frozenset({_E.DEPLOYING})

    @classmethod
    def status_transitions(cls) -> ServingTransitions[EndpointLifecycle]:
        return ServingTransitions(success=_E.READY, failure=None)

    async def execute(self, targets: Sequence[Target]) -> ServingHandlerResult:
        result = ServingHandlerResult()
        for target in targets:
            note = await self._step(target)
            if note is None:
                result.successes.append(target["id"])
                result.notes[target["id"]] = "rolled out"
            else:
                result.notes[target["id"]] = note
                result.due(DEPLOY_POLL_S)
        return result

    async def _step(self, target: Target) -> str | None:
        """One step of the update; None once it is complete."""
        now = self._sessions.clock()
        events: list[Event] = []
        if _ended_new(target) and target["previous_spec"] is not None:
            async with self._db.transaction() as conn:
                revision = await roll_back(conn, target)
            await self._announce_rollback(target, revision)
            return "rolling back: a replica of the new version ended before the update was done"
        live = replica_routes(target["routes"])
        current = [r for r in live if r["revision"] == target["revision"]]
        old = [r for r in live if r["revision"] != target["revision"]]
        healthy = [r for r in live if r["status"] == RouteStatus.HEALTHY.value]
        desired = target["desired_replicas"]
        spec = DeploymentSpec.model_validate(target["replica_spec"])
        floor = desired - spec.max_unavailable
        if not old and len(current) >= desired and len(healthy) >= desired:
            return None
        new: list[uuid.UUID] = []
        async with self._db.transaction() as conn:
            coming = [r for r in current if r["status"] != RouteStatus.HEALTHY.value]
            if len(current) < desired and not coming:
                new = [uuid.uuid4()]  # one new replica at a time
                await insert_routes(
                    conn, [(new[0], target["id"], None)], now, revision=target["revision"]
                )
            healthy_count = len(healthy)
            drained = []
            for route in drain_order(old):
                counts = route["status"] == RouteStatus.HEALTHY.value
                if counts and healthy_count - 1 < floor:
                    continue
                drained.append(route)
                healthy_count -= counts
            if drained:
                events = await end_routes(
                    conn, target, drained, self.name(), "replaced by the update", now,
                    notify=self._notify, drain_until=drain_deadline(target, now),
                )  # fmt: skip
        await publish_appended(self._events, events)
        waiting = new + [
            r["id"]
            for r in target["routes"]
            if r["session_id"] is None and RouteStatus(r["status"]) is RouteStatus.PROVISIONING
        ]
        refused = await self._create_sessions(target, waiting)
        return refused or f"{len(current)} of {desired} replica(s) updated"

    async def _announce_rollback(self, target: Target, revision: int) -> None:
        event = Event(
            kind=DEPLOYMENT_ROLLED_BACK,
            entity_type=DEPLOYMENT_ENTITY,
            entity_id=str(target["id"]),
            owner_id=target["owner_id"],
            payload={"name": target["name"], "revision": revision},
            created_at=self._sessions.clock(),
        )
        async with self._db.transaction() as conn:
            appended = await append_events(conn, [event], event.created_at, notify=self._notify)
        await publish_appended(self._events, appended)
