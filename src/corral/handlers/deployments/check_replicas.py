"""CheckReplicaDeployment: a ready deployment whose replica count changed scales again
(READY → SCALING)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from corral.coordination.serving_hints import ServingHint
from corral.domain.serving import ServingHandlerResult, ServingTransitions
from corral.domain.status import EndpointLifecycle
from corral.handlers.deployments._replicas import replica_routes
from corral.handlers.serving_base import ServingHandler, Target

_E = EndpointLifecycle


class CheckReplicaDeploymentHandler(ServingHandler[EndpointLifecycle]):
    """Success (to SCALING) for each ready deployment with more or fewer live routes than
    its desired replicas; the others are left alone."""

    next_hints: ClassVar[frozenset[str]] = frozenset({ServingHint.SCALE})

    @classmethod
    def name(cls) -> str:
        return "CheckReplicaDeployment"

    @property
    def target_statuses(self) -> frozenset[EndpointLifecycle]:
        return frozenset({_E.READY})

    @classmethod
    def status_transitions(cls) -> ServingTransitions[EndpointLifecycle]:
        return ServingTransitions(success=_E.SCALING, failure=None)

    async def execute(self, targets: Sequence[Target]) -> ServingHandlerResult:
        result = ServingHandlerResult()
        for target in targets:
            live = len(replica_routes(target["routes"]))
            if live != target["desired_replicas"]:
                result.successes.append(target["id"])
                result.notes[target["id"]] = (
                    f"{live} replica(s) for {target['desired_replicas']} wanted"
                )
        return result
