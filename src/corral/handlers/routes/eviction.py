"""RouteEviction: a route that stays UNHEALTHY is taken out (→ TERMINATING); the deployment
then provisions a replacement."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from corral.coordination.serving_hints import ServingHint
from corral.domain.deployment import HealthCheck
from corral.domain.serving import ServingHandlerResult, ServingTransitions
from corral.domain.status import RouteStatus
from corral.handlers.serving_base import ServingHandler, Target

_R = RouteStatus
# An UNHEALTHY route is evicted once it failed this many times its failure_threshold in a
# row: UNHEALTHY at the threshold takes it out of rotation at once, and as many failures more
# give it the chance to recover (a replica busy loading a model) before it is replaced.
EVICT_AFTER_THRESHOLDS = 2


def eviction_threshold(check: HealthCheck) -> int:
    """Failed probes in a row after which an unhealthy route is evicted."""
    return EVICT_AFTER_THRESHOLDS * check.failure_threshold


class RouteEvictionHandler(ServingHandler[RouteStatus]):
    """Success (to TERMINATING) for an UNHEALTHY route past the eviction threshold."""

    next_hints: ClassVar[frozenset[str]] = frozenset(
        {ServingHint.TERMINATE_ROUTES, ServingHint.CHECK_REPLICAS, ServingHint.SYNC_DISCOVERY}
    )

    @classmethod
    def name(cls) -> str:
        return "RouteEviction"

    @property
    def target_statuses(self) -> frozenset[RouteStatus]:
        return frozenset({_R.UNHEALTHY})

    @classmethod
    def status_transitions(cls) -> ServingTransitions[RouteStatus]:
        return ServingTransitions(success=_R.TERMINATING, failure=None)

    async def execute(self, targets: Sequence[Target]) -> ServingHandlerResult:
        result = ServingHandlerResult()
        for route in targets:
            check = HealthCheck.model_validate(route["replica_spec"].get("health_check") or {})
            threshold = eviction_threshold(check)
            if route["consecutive_failures"] >= threshold:
                result.successes.append(route["id"])
                result.notes[route["id"]] = (
                    f"{route['consecutive_failures']} failed probes in a row"
                )
        return result
