"""What the deployment handlers read from a deployment's routes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from corral.domain.deployment import DeploymentSpec
from corral.domain.status import ROUTE_LIVE, SESSION_TERMINAL, RouteStatus, SessionStatus


def live_routes(routes: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The routes that count as replicas (coming up or serving)."""
    return [r for r in routes if RouteStatus(r["status"]) in ROUTE_LIVE]


def session_ended(route: Mapping[str, Any]) -> bool:
    """Whether the route's replica session has ended."""
    status = route.get("session_status")
    return status is not None and SessionStatus(status) in SESSION_TERMINAL


def replica_routes(routes: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The live routes whose session has not ended: the replicas a deployment has. A live
    route whose session ended is being replaced (the route handlers end it)."""
    return [r for r in live_routes(routes) if not session_ended(r)]


# Which replicas go first when a deployment scales down: those not serving yet or any more,
# then the newest (the longest serving keep their warm caches).
_DRAIN_ORDER = {
    RouteStatus.PROVISIONING: 0,
    RouteStatus.UNHEALTHY: 1,
    RouteStatus.DEGRADED: 2,
    RouteStatus.HEALTHY: 3,
}


def drain_order(routes: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """`routes` in the order they are taken out when scaling down."""
    newest_first = sorted(routes, key=lambda r: r["created_at"], reverse=True)
    return sorted(newest_first, key=lambda r: _DRAIN_ORDER[RouteStatus(r["status"])])


def drain_deadline(deployment: Mapping[str, Any], now: datetime) -> datetime | None:
    """Until when a replica the deployment takes out may drain (None: a grace of 0, it ends
    at once)."""
    grace = DeploymentSpec.model_validate(deployment["replica_spec"]).drain_grace_s
    return now + timedelta(seconds=grace) if grace > 0 else None
