"""TerminatingRoute: end a route's replica session through `SessionController.mark_terminate`,
then the route (TERMINATING → TERMINATED) once the session has ended. A draining route's
session is ended only once its requests in flight have, or its grace period has passed."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import ClassVar

from corral.controller.sessions import SessionController
from corral.coordination.serving_hints import ServingHint
from corral.domain.serving import ServingHandlerResult, ServingTransitions
from corral.domain.status import RouteStatus
from corral.domain.types import Clock, SessionId
from corral.handlers.routes._drain import draining, still_serving
from corral.handlers.routes._sessions import session_ended
from corral.handlers.serving_base import ServingHandler, Target
from corral.store.database import Database

_R = RouteStatus
TERMINATE_POLL_S = 0.5
# A draining route is looked at again this often: nothing hints a proxy's report.
DRAIN_POLL_S = 0.5
TERMINATE_REASON = "its deployment's route ended"


class TerminatingRouteHandler(ServingHandler[RouteStatus]):
    """Success (to TERMINATED) for a route whose session ended (or that has none); the others'
    sessions are asked to end, and looked at again shortly."""

    next_hints: ClassVar[frozenset[str]] = frozenset(
        {ServingHint.DESTROY, ServingHint.CHECK_REPLICAS}
    )

    def __init__(self, sessions: SessionController, db: Database, clock: Clock) -> None:
        self._sessions = sessions
        self._db = db
        self._clock = clock

    @classmethod
    def name(cls) -> str:
        return "TerminatingRoute"

    @property
    def target_statuses(self) -> frozenset[RouteStatus]:
        return frozenset({_R.TERMINATING})

    @classmethod
    def status_transitions(cls) -> ServingTransitions[RouteStatus]:
        return ServingTransitions(success=_R.TERMINATED, failure=None)

    async def execute(self, targets: Sequence[Target]) -> ServingHandlerResult:
        result = ServingHandlerResult()
        now = self._clock()
        ending: list[uuid.UUID] = []
        drains: list[Target] = []
        for route in targets:
            if route["session_id"] is None or session_ended(route):
                result.successes.append(route["id"])
            elif draining(route, now) and route["host"] is not None:
                drains.append(route)
            else:
                ending.append(route["session_id"])
        waiting = await still_serving(self._db, drains, now)
        for route in drains:
            why = waiting.get(route["id"])
            if why is None:
                ending.append(route["session_id"])
                continue
            result.notes[route["id"]] = f"draining: {why}"
            result.due(min(DRAIN_POLL_S, (route["drain_until"] - now).total_seconds()))
        if ending:
            # Idempotent: a session already terminating is left as it is.
            await self._sessions.mark_terminate([SessionId(s) for s in ending], TERMINATE_REASON)
            result.due(TERMINATE_POLL_S)
        return result
