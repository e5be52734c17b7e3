"""DestroyingDeployment: end every route of a deployment being destroyed, then mark it
DESTROYED (DESTROYING → DESTROYED)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from corral.coordination.serving_hints import ServingHint
from corral.domain.events import Event
from corral.domain.serving import ServingHandlerResult, ServingTransitions
from corral.domain.status import ROUTE_TRANSITIONS, EndpointLifecycle, RouteStatus
from corral.domain.types import Clock
from corral.handlers.serving_base import ServingHandler, Target
from corral.infra.events import EventBus, publish_appended
from corral.store.database import Database
from corral.store.deployments import end_routes

_E = EndpointLifecycle
# Routes moved to TERMINATING when their deployment is destroyed.
_ENDING_FROM = ROUTE_TRANSITIONS.sources(RouteStatus.TERMINATING)


class DestroyingDeploymentHandler(ServingHandler[EndpointLifecycle]):
    """Moves a destroyed deployment's routes to TERMINATING; success (to DESTROYED) once every
    route is TERMINATED. Spec document 1 sends failure to DESTROYED as well: this handler
    reports none, it waits for the routes instead."""

    next_hints: ClassVar[frozenset[str]] = frozenset(
        {ServingHint.TERMINATE_ROUTES, ServingHint.SYNC_DISCOVERY}
    )

    def __init__(self, db: Database, events: EventBus | None, clock: Clock) -> None:
        self._db = db
        self._events = events
        self._notify = events.commit_channel if events is not None else None
        self._clock = clock

    @classmethod
    def name(cls) -> str:
        return "DestroyingDeployment"

    @property
    def target_statuses(self) -> frozenset[EndpointLifecycle]:
        return frozenset({_E.DESTROYING})

    @classmethod
    def status_transitions(cls) -> ServingTransitions[EndpointLifecycle]:
        return ServingTransitions(success=_E.DESTROYED, failure=_E.DESTROYED)

    async def execute(self, targets: Sequence[Target]) -> ServingHandlerResult:
        result = ServingHandlerResult()
        now = self._clock()
        ended: list[Event] = []
        async with self._db.transaction() as conn:
            for target in targets:
                ending = [r for r in target["routes"] if RouteStatus(r["status"]) in _ENDING_FROM]
                if ending:
                    ended += await end_routes(
                        conn, target, ending, self.name(), "deployment destroyed", now,
                        notify=self._notify,
                    )  # fmt: skip
        await publish_appended(self._events, ended)
        for target in targets:
            if all(RouteStatus(r["status"]) is RouteStatus.TERMINATED for r in target["routes"]):
                result.successes.append(target["id"])
                result.notes[target["id"]] = "every route ended"
            else:
                result.due(1.0)
        return result
