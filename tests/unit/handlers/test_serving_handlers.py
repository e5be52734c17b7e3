"""The deployment and route handlers against spec document 1's tables, the law over their
declarations, and each handler's sorting of targets into outcomes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from corral.coordination.serving import serving_coordinators
from corral.domain.serving import ServingResult
from corral.domain.status import (
    ENDPOINT_TRANSITIONS,
    ROUTE_TRANSITIONS,
    EndpointLifecycle,
    RouteStatus,
    SessionStatus,
)
from corral.handlers.deployments import (
    CheckPendingDeploymentHandler,
    CheckReplicaDeploymentHandler,
    ReconcileDeploymentHandler,
)
from corral.handlers.routes.provisioning import ProvisioningRouteHandler
from corral.handlers.routes.running import RunningRouteHandler
from corral.handlers.serving_base import ServingHandler

E, R = EndpointLifecycle, RouteStatus
NOW = datetime(2026, 1, 1, tzinfo=UTC)

# Spec document 1's deployment table, by hand: current statuses, SUCCESS, FAILURE.
SPEC_DEPLOYMENT = {
    "CheckPendingDeployment": ({E.PENDING, E.CREATED}, E.SCALING, None),
    "ScalingDeployment": ({E.SCALING}, E.READY, None),
    "CheckReplicaDeployment": ({E.READY}, E.SCALING, None),
    "ReconcileDeployment": ({E.READY}, None, E.SCALING),
    "DestroyingDeployment": ({E.DESTROYING}, E.DESTROYED, E.DESTROYED),
    # Beyond the spec (issue 38): rolling updates in the reserved DEPLOYING.
    "DeployingDeployment": ({E.DEPLOYING}, E.READY, None),
    # Beyond the spec (issue 38): autoscaling changes the replica count, as CheckReplica does.
    "AutoscaleDeployment": ({E.READY}, E.SCALING, None),
}
# Spec document 1's route table: current statuses, SUCCESS, FAILURE, STALE.
SPEC_ROUTE = {
    "ProvisioningRoute": ({R.PROVISIONING}, R.DEGRADED, R.FAILED_TO_START, None),
    "RunningRoute": (
        {R.DEGRADED, R.HEALTHY, R.UNHEALTHY, R.FAILED_TO_START},
        None,
        R.TERMINATING,
        None,
    ),
    "TerminatingRoute": ({R.TERMINATING}, R.TERMINATED, None, None),
    "HealthCheckRoute": (
        {R.HEALTHY, R.UNHEALTHY, R.DEGRADED},
        R.HEALTHY,
        R.UNHEALTHY,
        R.DEGRADED,
    ),
    "RouteEviction": ({R.UNHEALTHY}, R.TERMINATING, None, None),
    "ServiceDiscoverySync": ({R.HEALTHY}, None, None, None),
}


def _registries() -> tuple[list[ServingHandler[Any]], list[ServingHandler[Any]]]:
    nothing = cast(Any, None)  # the handlers' stores and controllers are not used here
    deployments, routes = serving_coordinators(nothing, nothing, None, nothing)
    return [h for h, _ in deployments.handlers], [h for h, _ in routes.handlers]


def test_deployment_handlers_are_spec_document_1s_table() -> None:
    """The five deployment handlers declare exactly the spec's targets and transitions (and
    the rolling update's its own)."""
    deployments, _ = _registries()
    declared = {
        h.name(): (
            set(h.target_statuses),
            h.status_transitions().success,
            h.status_transitions().failure,
        )
        for h in deployments
    }
    assert declared == SPEC_DEPLOYMENT


def test_route_handlers_are_spec_document_1s_table() -> None:
    """The six route handlers declare exactly the spec's targets and transitions."""
    _, routes = _registries()
    declared = {
        h.name(): (
            set(h.target_statuses),
            h.status_transitions().success,
            h.status_transitions().failure,
            h.status_transitions().stale,
        )
        for h in routes
    }
    assert declared == SPEC_ROUTE


@pytest.mark.parametrize("result", list(ServingResult))
def test_every_declared_transition_is_allowed_by_the_tables(result: ServingResult) -> None:
    """The law: every (target status, outcome) a handler declares is an edge of its table."""
    deployments, routes = _registries()
    for handlers, table in ((deployments, ENDPOINT_TRANSITIONS), (routes, ROUTE_TRANSITIONS)):
        for handler in handlers:
            target = handler.status_transitions().for_result(result)
            if target is None:
                continue
            for source in handler.target_statuses:
                if source != target:
                    assert table.allowed(source, target), (handler.name(), source, target)


def _deployment(desired: int, *routes: dict[str, Any]) -> dict[str, Any]:
    return {"id": uuid.uuid4(), "desired_replicas": desired, "routes": list(routes)}


def _route(
    status: RouteStatus, session: SessionStatus | None = SessionStatus.RUNNING, **more: Any
) -> dict[str, Any]:
    return {
        "id": uuid.uuid4(),
        "status": status.value,
        "session_id": None if session is None else uuid.uuid4(),
        "session_status": None if session is None else session.value,
        "created_at": NOW,
        "runtime_info": {},
        **more,
    }


async def test_check_pending_starts_every_pending_deployment() -> None:
    """CheckPendingDeployment: every target succeeds."""
    targets = [_deployment(1), _deployment(0)]
    result = await CheckPendingDeploymentHandler().execute(targets)
    assert result.successes == [t["id"] for t in targets]


async def test_check_replicas_scales_only_a_mismatched_count() -> None:
    """CheckReplicaDeployment: success for more or fewer replicas than desired, none else."""
    right = _deployment(1, _route(R.HEALTHY))
    fewer = _deployment(2, _route(R.HEALTHY))
    more = _deployment(0, _route(R.DEGRADED))
    ended = _deployment(1, _route(R.HEALTHY, SessionStatus.ERROR))
    result = await CheckReplicaDeploymentHandler().execute([right, fewer, more, ended])
    assert result.successes == [fewer["id"], more["id"], ended["id"]]
    assert result.failures == []


async def test_reconcile_fails_a_deployment_whose_route_lost_its_session() -> None:
    """ReconcileDeployment: failure for a live route whose session ended or is missing."""
    fine = _deployment(1, _route(R.HEALTHY))
    ended = _deployment(1, _route(R.HEALTHY, SessionStatus.TERMINATED))
    missing = _deployment(1, _route(R.PROVISIONING, None))
    result = await ReconcileDeploymentHandler().execute([fine, ended, missing])
    assert result.failures == [ended["id"], missing["id"]]
    assert result.successes == []


async def test_provisioning_sorts_routes_by_their_session() -> None:
    """ProvisioningRoute: success with an address, failure when ended or too late, else wait."""
    ready = _route(R.PROVISIONING, runtime_info={"host": "10.0.0.1", "port": 8000})
    no_port = _route(R.PROVISIONING, runtime_info={"host": "10.0.0.1"})
    ended = _route(R.PROVISIONING, SessionStatus.ERROR)
    late = _route(R.PROVISIONING, SessionStatus.PENDING, created_at=NOW - timedelta(seconds=61))
    handler = ProvisioningRouteHandler(lambda: NOW, start_timeout_s=60)
    result = await handler.execute([ready, no_port, ended, late])
    assert result.successes == [ready["id"]]
    assert result.values[ready["id"]] == {"host": "10.0.0.1", "port": 8000}
    assert result.failures == [ended["id"], late["id"]]
    assert result.due_in_s is not None  # no_port is looked at again


async def test_running_ends_routes_that_lost_their_replica() -> None:
    """RunningRoute: failure for FAILED_TO_START and for an ended session, none else."""
    serving = _route(R.HEALTHY)
    failed = _route(R.FAILED_TO_START, SessionStatus.CANCELLED)
    ended = _route(R.DEGRADED, SessionStatus.TERMINATED)
    result = await RunningRouteHandler().execute([serving, failed, ended])
    assert result.failures == [failed["id"], ended["id"]]
    assert result.successes == []
