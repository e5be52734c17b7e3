"""ScalingDeployment: add or take out replicas until the deployment has its desired count
(SCALING → READY).

A replica is added as a route (PROVISIONING) and an INFERENCE session created through
`SessionController.enqueue` with the route's id as its `creation_id`: a run that dies between
the two finds the route without its session and enqueues again, getting the same session. A
replica taken out is a route moved to TERMINATING; TerminatingRoute ends its session through
`SessionController.mark_terminate`. No second path creates or ends sessions.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import ClassVar

from corral.controller.sessions import SessionController, SubmissionError
from corral.coordination.serving_hints import ServingHint
from corral.domain.deployment import DeploymentSpec
from corral.domain.events import Event
from corral.domain.serving import ServingHandlerResult, ServingTransitions
from corral.domain.status import EndpointLifecycle, RouteStatus
from corral.domain.types import UserId
from corral.handlers.deployments._replicas import drain_deadline, drain_order, replica_routes
from corral.handlers.serving_base import ServingHandler, Target
from corral.infra.events import EventBus, publish_appended
from corral.store.database import Database
from corral.store.deployments import end_routes, insert_routes, set_route_sessions

_E = EndpointLifecycle


def replica_creation_id(route_id: uuid.UUID) -> str:
    """The creation id of a route's replica session: one session per route, however often
    its creation is retried."""
    return f"route-{route_id}"


class ScalingDeploymentHandler(ServingHandler[EndpointLifecycle]):
    """Success (to READY) once a deployment's replicas were added or taken out; failure (it
    stays SCALING, tried again) when a replica's session was refused."""

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
        self._db = db
        self._sessions = sessions
        self._events = events
        self._notify = events.commit_channel if events is not None else None

    @classmethod
    def name(cls) -> str:
        return "ScalingDeployment"

    @property
    def target_statuses(self) -> frozenset[EndpointLifecycle]:
        return frozenset({_E.SCALING})

    @classmethod
    def status_transitions(cls) -> ServingTransitions[EndpointLifecycle]:
        return ServingTransitions(success=_E.READY, failure=None)

    async def execute(self, targets: Sequence[Target]) -> ServingHandlerResult:
        result = ServingHandlerResult()
        now = self._sessions.clock()
        for target in targets:
            deployment_id = target["id"]
            replicas = replica_routes(target["routes"])
            missing = target["desired_replicas"] - len(replicas)
            new: list[uuid.UUID] = []
            ended: list[Event] = []
            async with self._db.transaction() as conn:
                if missing > 0:
                    new = [uuid.uuid4() for _ in range(missing)]
                    await insert_routes(
                        conn,
                        [(r, deployment_id, None) for r in new],
                        now,
                        revision=target["revision"],
                    )
                elif missing < 0:
                    ended = await end_routes(
                        conn,
                        target,
                        drain_order(replicas)[:-missing],
                        self.name(),
                        f"scaled down to {target['desired_replicas']}",
                        now,
                        notify=self._notify,
                        drain_until=drain_deadline(target, now),
                    )
            await publish_appended(self._events, ended)
            # The routes still waiting for their session: the new ones, and any a run that
            # died left behind.
            waiting = new + [
                r["id"]
                for r in target["routes"]
                if r["session_id"] is None and RouteStatus(r["status"]) is RouteStatus.PROVISIONING
            ]
            refused = await self._create_sessions(target, waiting)
            if refused is None:
                result.successes.append(deployment_id)
                result.notes[deployment_id] = _said(missing)
            else:
                result.failures.append(deployment_id)
                result.notes[deployment_id] = refused
        return result

    async def _create_sessions(self, target: Target, route_ids: Sequence[uuid.UUID]) -> str | None:
        """Enqueue a replica session per route and record it; why one was refused, or None."""
        if not route_ids:
            return None
        spec = DeploymentSpec.model_validate(target["replica_spec"])
        created: dict[uuid.UUID, uuid.UUID] = {}
        refused: str | None = None
        for route_id in route_ids:
            try:
                submitted = await self._sessions.enqueue(
                    spec.replica_spec(replica_creation_id(route_id)), UserId(target["owner_id"])
                )
            except SubmissionError as exc:
                refused = f"a replica's session was refused: {exc.field}: {exc}"
                break
            created[route_id] = submitted.session_id
        if created:
            async with self._db.transaction() as conn:
                await set_route_sessions(conn, created)
        return refused


def _said(missing: int) -> str:
    if missing > 0:
        return f"{missing} replica(s) added"
    if missing < 0:
        return f"{-missing} replica(s) taken out"
    return "replicas as desired"
