"""ReconcileDeployment: a ready deployment whose routes and replica sessions disagree (a route
counted live whose session ended, or that has no session) scales again (READY → SCALING)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from corral.coordination.serving_hints import ServingHint
from corral.domain.serving import ServingHandlerResult, ServingTransitions
from corral.domain.status import EndpointLifecycle
from corral.handlers.deployments._replicas import live_routes, session_ended
from corral.handlers.serving_base import ServingHandler, Target

_E = EndpointLifecycle


class ReconcileDeploymentHandler(ServingHandler[EndpointLifecycle]):
    """Failure (to SCALING) for each ready deployment with a mismatched route; success keeps
    the others as they are."""

    next_hints: ClassVar[frozenset[str]] = frozenset(
        {ServingHint.SCALE, ServingHint.CHECK_RUNNING_ROUTES}
    )

    @classmethod
    def name(cls) -> str:
        return "ReconcileDeployment"

    @property
    def target_statuses(self) -> frozenset[EndpointLifecycle]:
        return frozenset({_E.READY})

    @classmethod
    def status_transitions(cls) -> ServingTransitions[EndpointLifecycle]:
        return ServingTransitions(success=None, failure=_E.SCALING)

    async def execute(self, targets: Sequence[Target]) -> ServingHandlerResult:
        result = ServingHandlerResult()
        for target in targets:
            mismatched = [
                r
                for r in live_routes(target["routes"])
                if r["session_id"] is None or session_ended(r)
            ]
            if mismatched:
                result.failures.append(target["id"])
                result.notes[target["id"]] = (
                    f"{len(mismatched)} route(s) without a running replica session"
                )
        return result
