"""The four status enums and their transition tables.

Every edge names the rule that admits it: a handler of spec document 1 (its tables and diagrams),
or one of the lifecycle rules DESIGN.md adds (terminate requests, ERROR as the failed terminal
status, CANCELLED for sessions that never ran). Nothing else is allowed.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from corral.domain.lifecycle import TransitionTable


class SessionStatus(StrEnum):
    """Where a session stands in its lifecycle (spec document 1)."""

    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    PREPARING = "PREPARING"
    PREPARED = "PREPARED"
    CREATING = "CREATING"
    RUNNING = "RUNNING"
    TERMINATING = "TERMINATING"
    TERMINATED = "TERMINATED"
    CANCELLED = "CANCELLED"
    ERROR = "ERROR"


class KernelStatus(StrEnum):
    """Where one kernel stands; the session's statuses plus PULLING (image/environment fetch)."""

    PENDING = "PENDING"
    SCHEDULED = "SCHEDULED"
    PREPARING = "PREPARING"
    PULLING = "PULLING"
    PREPARED = "PREPARED"
    CREATING = "CREATING"
    RUNNING = "RUNNING"
    TERMINATING = "TERMINATING"
    TERMINATED = "TERMINATED"
    CANCELLED = "CANCELLED"
    ERROR = "ERROR"


class EndpointLifecycle(StrEnum):
    """Lifecycle of a model-serving deployment (spec document 1, deployment handlers)."""

    PENDING = "pending"
    CREATED = "created"  # deprecated upstream in favour of READY; accepted, never entered
    SCALING = "scaling"
    READY = "ready"
    DEPLOYING = "deploying"  # a rolling update in progress
    DESTROYING = "destroying"
    DESTROYED = "destroyed"


class RouteStatus(StrEnum):
    """Status of one replica (route) of a deployment (spec document 1, route handlers)."""

    PROVISIONING = "provisioning"
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"
    DEGRADED = "degraded"
    TERMINATING = "terminating"
    TERMINATED = "terminated"
    FAILED_TO_START = "failed_to_start"


_S = SessionStatus
_K = KernelStatus
_E = EndpointLifecycle
_R = RouteStatus

# Rule names used in the tables: where an edge comes from.
SPEC1 = "spec document 1"
DESIGN = "DESIGN.md lifecycles"
SPEC2 = "spec document 2"

SESSION_TRANSITIONS: TransitionTable[SessionStatus] = TransitionTable(
    "SessionStatus",
    SessionStatus,
    initial=_S.PENDING,
    terminal=(_S.TERMINATED, _S.CANCELLED, _S.ERROR),
    edges=[
        (_S.PENDING, _S.SCHEDULED, "ScheduleNewSessions", SPEC1),
        (_S.PENDING, _S.CANCELLED, "ScheduleNewSessions expired/give_up, or cancel", SPEC1),
        (_S.SCHEDULED, _S.PREPARING, "PrepareSessions", SPEC1),
        ((_S.SCHEDULED, _S.PREPARING), _S.PREPARED, "PromoteToPrepared", SPEC1),
        ((_S.SCHEDULED, _S.PREPARING), _S.PENDING, "PrepareSessions expired/give_up", SPEC1),
        (_S.PREPARED, _S.CREATING, "StartSessions", SPEC1),
        (_S.PREPARED, _S.PENDING, "StartSessions expired/give_up", SPEC1),
        (_S.CREATING, _S.PENDING, "expired while CREATING (diagram)", SPEC1),
        (_S.CREATING, _S.RUNNING, "PromoteToRunning", SPEC1),
        (_S.RUNNING, _S.PENDING, "EvictNotReady: KernelsReady recovery timeout", SPEC2),
        (_S.RUNNING, _S.TERMINATING, "DetectTermination / terminate request", SPEC1),
        (_S.TERMINATING, _S.TERMINATED, "TerminateSessions / PromoteToTerminated", SPEC1),
        (
            (_S.SCHEDULED, _S.PREPARING, _S.PREPARED, _S.CREATING),
            _S.TERMINATING,
            "terminate request / kernel failed before running",
            DESIGN,
        ),
        (_S.TERMINATING, _S.ERROR, "PromoteToTerminated (a kernel failed)", DESIGN),
        (
            (_S.PENDING, _S.SCHEDULED, _S.PREPARING, _S.PREPARED, _S.CREATING, _S.RUNNING),
            _S.ERROR,
            "isolated: a row no code path can handle (invalid_request)",
            DESIGN,
        ),
        (_S.TERMINATING, _S.CANCELLED, "PromoteToTerminated (never ran)", DESIGN),
    ],
)

_KERNEL_BEFORE_RUNNING = (
    _K.PENDING,
    _K.SCHEDULED,
    _K.PREPARING,
    _K.PULLING,
    _K.PREPARED,
    _K.CREATING,
)

KERNEL_TRANSITIONS: TransitionTable[KernelStatus] = TransitionTable(
    "KernelStatus",
    KernelStatus,
    initial=_K.PENDING,
    terminal=(_K.TERMINATED, _K.CANCELLED, _K.ERROR),
    edges=[
        (_K.PENDING, _K.SCHEDULED, "ScheduleNewSessions", SPEC1),
        (_K.PENDING, _K.CANCELLED, "ScheduleNewSessions expired/give_up", SPEC1),
        (_K.SCHEDULED, _K.PREPARING, "PrepareSessions", SPEC1),
        (_K.PREPARING, _K.PULLING, "agent: fetching the image", SPEC1),
        ((_K.PREPARING, _K.PULLING), _K.PREPARED, "agent: prepared", SPEC1),
        (
            (_K.SCHEDULED, _K.PREPARING, _K.PULLING, _K.PREPARED, _K.CREATING),
            _K.PENDING,
            "session re-scheduled (expired/give_up)",
            SPEC1,
        ),
        # A CREATING session may expire with some kernels already started; the agent stops
        # whatever is no longer assigned to it, so the kernel's record starts over as PENDING.
        (_K.RUNNING, _K.PENDING, "session re-scheduled while CREATING", DESIGN),
        (_K.PREPARED, _K.CREATING, "StartSessions", SPEC1),
        (_K.CREATING, _K.RUNNING, "agent: started", SPEC1),
        (
            (_K.SCHEDULED, _K.PREPARING, _K.PULLING, _K.PREPARED, _K.CREATING, _K.RUNNING),
            _K.TERMINATING,
            "agent: exited or stopping",
            DESIGN,
        ),
        (
            (*_KERNEL_BEFORE_RUNNING, _K.RUNNING, _K.TERMINATING),
            _K.TERMINATED,
            "TerminateSessions / agent: finished",
            SPEC1,
        ),
        (
            (*_KERNEL_BEFORE_RUNNING, _K.RUNNING, _K.TERMINATING),
            _K.ERROR,
            "agent: failed / agent lost",
            DESIGN,
        ),
        (
            (*_KERNEL_BEFORE_RUNNING[1:], _K.TERMINATING),
            _K.CANCELLED,
            "session cancelled before the kernel ran",
            DESIGN,
        ),
    ],
)

ENDPOINT_TRANSITIONS: TransitionTable[EndpointLifecycle] = TransitionTable(
    "EndpointLifecycle",
    EndpointLifecycle,
    initial=_E.PENDING,
    terminal=(_E.DESTROYED,),
    edges=[
        ((_E.PENDING, _E.CREATED), _E.SCALING, "CheckPendingDeployment", SPEC1),
        (_E.SCALING, _E.READY, "ScalingDeployment", SPEC1),
        # AutoscaleDeployment (issue 38, beyond the spec) changes the replica count: the
        # spec's edge for a replica count to adjust.
        (
            _E.READY,
            _E.SCALING,
            "CheckReplicaDeployment / ReconcileDeployment (/ AutoscaleDeployment)",
            SPEC1,
        ),
        (
            (_E.PENDING, _E.CREATED, _E.SCALING, _E.READY, _E.DEPLOYING),
            _E.DESTROYING,
            "destroy request",
            DESIGN,
        ),
        (_E.DESTROYING, _E.DESTROYED, "DestroyingDeployment", SPEC1),
        # Rolling updates use the reserved DEPLOYING (issue 38): an update request starts one,
        # DeployingDeployment ends it once the new version (or, rolled back, the old) serves.
        ((_E.READY, _E.SCALING), _E.DEPLOYING, "update request", DESIGN),
        (_E.DEPLOYING, _E.READY, "DeployingDeployment (rolled out or rolled back)", DESIGN),
    ],
)

ROUTE_TRANSITIONS: TransitionTable[RouteStatus] = TransitionTable(
    "RouteStatus",
    RouteStatus,
    initial=_R.PROVISIONING,
    terminal=(_R.TERMINATED,),
    edges=[
        (_R.PROVISIONING, _R.DEGRADED, "ProvisioningRoute", SPEC1),
        (_R.PROVISIONING, _R.FAILED_TO_START, "ProvisioningRoute failure", SPEC1),
        ((_R.UNHEALTHY, _R.DEGRADED), _R.HEALTHY, "HealthCheckRoute", SPEC1),
        ((_R.HEALTHY, _R.DEGRADED), _R.UNHEALTHY, "HealthCheckRoute failure", SPEC1),
        ((_R.HEALTHY, _R.UNHEALTHY), _R.DEGRADED, "HealthCheckRoute stale", SPEC1),
        (_R.UNHEALTHY, _R.TERMINATING, "RouteEviction", SPEC1),
        (
            (_R.DEGRADED, _R.HEALTHY, _R.UNHEALTHY, _R.FAILED_TO_START),
            _R.TERMINATING,
            "RunningRoute failure",
            SPEC1,
        ),
        (_R.TERMINATING, _R.TERMINATED, "TerminatingRoute", SPEC1),
        # A replica still coming up is taken out too when its deployment scales down or is
        # destroyed (the spec's diagram has no edge for it; its session is ended as any).
        (_R.PROVISIONING, _R.TERMINATING, "ScalingDeployment / DestroyingDeployment", DESIGN),
    ],
)

ALL_TRANSITION_TABLES: tuple[TransitionTable[Any], ...] = (
    SESSION_TRANSITIONS,
    KERNEL_TRANSITIONS,
    ENDPOINT_TRANSITIONS,
    ROUTE_TRANSITIONS,
)

# Named status sets the handlers use (spec document 1's handler tables).
SESSION_TERMINAL = SESSION_TRANSITIONS.terminal
SESSION_NON_TERMINAL = SESSION_TRANSITIONS.non_terminal
KERNEL_TERMINAL = KERNEL_TRANSITIONS.terminal
KERNEL_NON_TERMINAL = KERNEL_TRANSITIONS.non_terminal
# PromoteToPrepared: no kernel may still be in one of these.
KERNEL_NOT_YET_PREPARED = frozenset({_K.PENDING, _K.SCHEDULED, _K.PREPARING, _K.PULLING})
# PromoteToRunning: no kernel may still be in one of these.
KERNEL_NOT_YET_RUNNING = frozenset(_KERNEL_BEFORE_RUNNING)
# Kernels that started on their agent: an agent lost fails these (`agent_lost`) and asks
# about them when quiet (`store.kernel_checks`); the others go back to PENDING with their session.
KERNEL_STARTED = frozenset({_K.RUNNING, _K.TERMINATING})
# Routes that count as a deployment's replicas: coming up or serving (spec document 1's
# route diagram before TERMINATING); FAILED_TO_START and TERMINATING ones are being replaced.
ROUTE_LIVE = frozenset({_R.PROVISIONING, _R.DEGRADED, _R.HEALTHY, _R.UNHEALTHY})
# Sessions holding agent resources (their kernels occupy slots).
SESSION_OCCUPYING = frozenset(
    {_S.SCHEDULED, _S.PREPARING, _S.PREPARED, _S.CREATING, _S.RUNNING, _S.TERMINATING}
)

# Each status by its value: a status read from the database is then a dictionary look-up, not
# an Enum call (`KernelStatus(value)`), which the read paths would pay per row.
SESSION_STATUS_BY_VALUE: dict[str, SessionStatus] = {status.value: status for status in _S}
KERNEL_STATUS_BY_VALUE: dict[str, KernelStatus] = {status.value: status for status in _K}

# How far along its placement a kernel is: every forward move of the kernel table goes to a
# higher stage (a test checks it), and every terminal status is the last stage. A report
# naming a lower stage than the kernel's is one the kernel has already passed (re-sent after a
# lost answer): acknowledged as applied, never a conflict (`store.kernel_reports`); the agent
# sends nothing at or below the stage the manager acknowledged (`agent.shipper`).
KERNEL_STAGE: dict[KernelStatus, int] = {
    _K.PENDING: 0,
    _K.SCHEDULED: 1,
    _K.PREPARING: 2,
    _K.PULLING: 3,
    _K.PREPARED: 4,
    _K.CREATING: 5,
    _K.RUNNING: 6,
    _K.TERMINATING: 7,
    _K.TERMINATED: 8,
    _K.CANCELLED: 8,
    _K.ERROR: 8,
}


def kernel_passed(status: KernelStatus, current: KernelStatus) -> bool:
    """Whether a kernel now in `current` went through `status` on its way (a live kernel only:
    which statuses an ended one went through, its status alone cannot tell)."""
    return current not in KERNEL_TERMINAL and KERNEL_STAGE[status] < KERNEL_STAGE[current]
