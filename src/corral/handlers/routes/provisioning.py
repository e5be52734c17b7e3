"""ProvisioningRoute: a route becomes DEGRADED (reachable, not yet probed healthy) once its
replica session runs with an address, FAILED_TO_START when the session ends first or does not
run within the start timeout."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from corral.coordination.serving_hints import ServingHint
from corral.domain.serving import ServingHandlerResult, ServingTransitions
from corral.domain.status import RouteStatus, SessionStatus
from corral.domain.types import Clock
from corral.handlers.routes._sessions import replica_address, session_ended
from corral.handlers.serving_base import ServingHandler, Target

_R = RouteStatus
# A route whose session runs but whose address its agent has not reported yet is looked at
# again this soon (no hint announces the address). A session's start or end wakes the task
# (`coordination.hints`), and the start timeout is a due time.
ADDRESS_POLL_S = 0.5
DEFAULT_START_TIMEOUT_S = 900.0


class ProvisioningRouteHandler(ServingHandler[RouteStatus]):
    """Success (to DEGRADED, its address recorded) once the replica runs with an address;
    failure (to FAILED_TO_START) when its session ended or the start timeout passed."""

    next_hints: ClassVar[frozenset[str]] = frozenset(
        {ServingHint.CHECK_HEALTH, ServingHint.CHECK_RUNNING_ROUTES}
    )

    def __init__(self, clock: Clock, start_timeout_s: float = DEFAULT_START_TIMEOUT_S) -> None:
        self._clock = clock
        self._start_timeout_s = start_timeout_s

    @classmethod
    def name(cls) -> str:
        return "ProvisioningRoute"

    @property
    def target_statuses(self) -> frozenset[RouteStatus]:
        return frozenset({_R.PROVISIONING})

    @classmethod
    def status_transitions(cls) -> ServingTransitions[RouteStatus]:
        return ServingTransitions(success=_R.DEGRADED, failure=_R.FAILED_TO_START)

    async def execute(self, targets: Sequence[Target]) -> ServingHandlerResult:
        result = ServingHandlerResult()
        now = self._clock()
        for route in targets:
            route_id = route["id"]
            address = replica_address(route)
            if address is not None:
                result.successes.append(route_id)
                result.values[route_id] = {"host": address[0], "port": address[1]}
                result.notes[route_id] = f"replica running at {address[0]}:{address[1]}"
            elif session_ended(route):
                result.failures.append(route_id)
                result.notes[route_id] = (
                    f"its replica session ended ({route['session_status']}) before serving"
                )
            elif (waited_s := (now - route["created_at"]).total_seconds()) > self._start_timeout_s:
                result.failures.append(route_id)
                result.notes[route_id] = (
                    f"its replica did not start within {self._start_timeout_s:g} s"
                )
            elif route.get("session_status") == SessionStatus.RUNNING.value:
                result.due(ADDRESS_POLL_S)
            else:
                result.due(self._start_timeout_s - waited_s)
        return result
