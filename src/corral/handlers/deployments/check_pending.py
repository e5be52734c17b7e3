"""CheckPendingDeployment: a new deployment starts scaling (PENDING/CREATED → SCALING)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from corral.coordination.serving_hints import ServingHint
from corral.domain.serving import ServingHandlerResult, ServingTransitions
from corral.domain.status import EndpointLifecycle
from corral.handlers.serving_base import ServingHandler, Target

_E = EndpointLifecycle


class CheckPendingDeploymentHandler(ServingHandler[EndpointLifecycle]):
    """Every pending deployment goes on to scaling; failure keeps it pending."""

    next_hints: ClassVar[frozenset[str]] = frozenset({ServingHint.SCALE})

    @classmethod
    def name(cls) -> str:
        return "CheckPendingDeployment"

    @property
    def target_statuses(self) -> frozenset[EndpointLifecycle]:
        return frozenset({_E.PENDING, _E.CREATED})

    @classmethod
    def status_transitions(cls) -> ServingTransitions[EndpointLifecycle]:
        return ServingTransitions(success=_E.SCALING, failure=None)

    async def execute(self, targets: Sequence[Target]) -> ServingHandlerResult:
        return ServingHandlerResult(successes=[t["id"] for t in targets])
