"""HealthCheckRoute: probe the serving routes over HTTP, each at its health check's interval;
thresholds of passed and failed probes in a row, counted in the route's row, make it HEALTHY
or UNHEALTHY, and health not probed for too long makes it DEGRADED (stale)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, ClassVar

from corral.coordination.serving_hints import ServingHint
from corral.domain.deployment import HealthCheck
from corral.domain.serving import ServingHandlerResult, ServingTransitions
from corral.domain.status import RouteStatus
from corral.domain.types import Clock
from corral.handlers.routes._probe import ProbeTarget, probe_all
from corral.handlers.routes._sessions import replica_address
from corral.handlers.serving_base import ServingHandler, Target

_R = RouteStatus
# Health probed longer ago than this many intervals (plus the probe's timeout) is stale: the
# managers stopped probing for a while (all down, or overloaded), so HEALTHY or UNHEALTHY is
# no longer known.
STALE_AFTER_INTERVALS = 3


class HealthCheckRouteHandler(ServingHandler[RouteStatus]):
    """Success (to HEALTHY) after success_threshold passed probes in a row, failure (to
    UNHEALTHY) after failure_threshold failed ones, stale (to DEGRADED) when its last probe
    is too old. A probe between thresholds only counts."""

    next_hints: ClassVar[frozenset[str]] = frozenset(
        {ServingHint.SYNC_DISCOVERY, ServingHint.EVICT_ROUTES}
    )

    def __init__(self, clock: Clock, on_failed_probes: Callable[[int], None] | None = None) -> None:
        self._clock = clock
        self._on_failed_probes = on_failed_probes  # the count of a run's failed probes (metrics)

    @classmethod
    def name(cls) -> str:
        return "HealthCheckRoute"

    @property
    def target_statuses(self) -> frozenset[RouteStatus]:
        return frozenset({_R.HEALTHY, _R.UNHEALTHY, _R.DEGRADED})

    @classmethod
    def status_transitions(cls) -> ServingTransitions[RouteStatus]:
        return ServingTransitions(success=_R.HEALTHY, failure=_R.UNHEALTHY, stale=_R.DEGRADED)

    async def execute(self, targets: Sequence[Target]) -> ServingHandlerResult:
        result = ServingHandlerResult()
        now = self._clock()
        due: list[tuple[Target, HealthCheck, tuple[str, int]]] = []
        for route in targets:
            check = HealthCheck.model_validate(route["replica_spec"].get("health_check") or {})
            address = replica_address(route)
            if address is None:
                continue  # its session ended: RunningRoute ends the route
            if _stale(route, check, now):
                result.stale.append(route["id"])
                result.notes[route["id"]] = "its health was not probed for too long"
                result.values[route["id"]] = {"consecutive_successes": 0}
                result.due(0.0)
                continue
            next_at = _next_probe_at(route, check)
            if next_at > now:
                result.due((next_at - now).total_seconds())
                continue
            due.append((route, check, address))
            result.due(check.interval_s)
        outcomes = await probe_all([ProbeTarget(a[0], a[1], c) for _, c, a in due])
        if self._on_failed_probes is not None:
            self._on_failed_probes(sum(not o.passed for o in outcomes))
        for (route, check, _), outcome in zip(due, outcomes, strict=True):
            route_id = route["id"]
            values: dict[str, Any] = {"probed_at": now, "health_info": outcome.said}
            if outcome.passed:
                successes = route["consecutive_successes"] + 1
                values |= {"consecutive_successes": successes, "consecutive_failures": 0}
                if successes >= check.success_threshold:
                    result.successes.append(route_id)
            else:
                failures = route["consecutive_failures"] + 1
                values |= {"consecutive_failures": failures, "consecutive_successes": 0}
                if failures >= check.failure_threshold:
                    result.failures.append(route_id)
            result.values[route_id] = values
            result.notes[route_id] = outcome.said
        return result


def _next_probe_at(route: Target, check: HealthCheck) -> datetime:
    """When the route is probed next: an interval after its last probe, or (never probed)
    its initial delay after it came up."""
    probed_at: datetime | None = route["probed_at"]
    if probed_at is None:
        came_up: datetime = route["status_changed_at"]
        return came_up + timedelta(seconds=check.initial_delay_s)
    return probed_at + timedelta(seconds=check.interval_s)


def _stale(route: Target, check: HealthCheck, now: datetime) -> bool:
    """Whether a HEALTHY or UNHEALTHY route's last probe is too old to stand."""
    probed_at: datetime | None = route["probed_at"]
    if RouteStatus(route["status"]) is _R.DEGRADED or probed_at is None:
        return False
    limit_s = STALE_AFTER_INTERVALS * check.interval_s + check.timeout_s
    return (now - probed_at).total_seconds() > limit_s
