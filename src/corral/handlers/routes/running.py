"""RunningRoute: a route whose replica session ended, or that failed to start, is ended
(→ TERMINATING); the deployment then provisions a replacement. Woken by a session's end
(`coordination.hints`) and by ProvisioningRoute's failures; it polls no more."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from corral.coordination.serving_hints import ServingHint
from corral.domain.serving import ServingHandlerResult, ServingTransitions
from corral.domain.status import RouteStatus
from corral.handlers.routes._sessions import session_ended
from corral.handlers.serving_base import ServingHandler, Target

_R = RouteStatus


class RunningRouteHandler(ServingHandler[RouteStatus]):
    """Failure (to TERMINATING) for a route that failed to start or whose session ended;
    success keeps the others."""

    next_hints: ClassVar[frozenset[str]] = frozenset(
        {
            ServingHint.TERMINATE_ROUTES,
            ServingHint.CHECK_REPLICAS,
            ServingHint.SYNC_DISCOVERY,
        }
    )

    @classmethod
    def name(cls) -> str:
        return "RunningRoute"

    @property
    def target_statuses(self) -> frozenset[RouteStatus]:
        return frozenset({_R.DEGRADED, _R.HEALTHY, _R.UNHEALTHY, _R.FAILED_TO_START})

    @classmethod
    def status_transitions(cls) -> ServingTransitions[RouteStatus]:
        return ServingTransitions(success=None, failure=_R.TERMINATING)

    async def execute(self, targets: Sequence[Target]) -> ServingHandlerResult:
        result = ServingHandlerResult()
        for route in targets:
            route_id = route["id"]
            if RouteStatus(route["status"]) is _R.FAILED_TO_START:
                result.failures.append(route_id)
                result.notes[route_id] = "it failed to start"
            elif route["session_id"] is None or session_ended(route):
                result.failures.append(route_id)
                result.notes[route_id] = f"its replica session ended ({route['session_status']})"
        return result
