"""EvictNotReady: all-or-nothing admission's timeouts (spec document 2), per resource group.

In a group that enables `wait_for_kernels_ready`, an admitted session whose KernelsReady
condition has been false longer than `timeout_s` since admission (`WaitForStart`), or longer
than `recovery_timeout_s` since it turned false while running (`WaitForRecovery`), is evicted:
its kernels go back to PENDING (their agents stop them and give back their slots) and so does
the session, with eviction reason `KernelsReadyTimeout`, one more eviction counted and a
requeue time `min(base * 2**(n-1), max)` ahead that never moves earlier. When the count would
pass `backoff_limit_count`, or `backoff_limit_timeout_s` has passed since the first eviction of
the cycle, the session is deactivated at once instead: it stays PENDING out of the queue with
its requeue state reset, until `activate` puts it back. A deactivated session kept longer than
`deactivated_retention_s` is cancelled.

Not a lifecycle handler over a status (every admitted session would be its target): it reads
only the not-ready sessions of the enabled groups, and with no group enabled reads nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from corral.domain.admission import (
    KERNELS_READY_TIMEOUT,
    KernelsReadyReason,
    WaitForKernelsReady,
    requeue_time,
)
from corral.domain.events import (
    SESSION_DEACTIVATED,
    SESSION_ENTITY,
    SESSION_EVICTED,
    SESSION_REQUEUED,
    Event,
)
from corral.domain.failure_causes import FailureCause
from corral.domain.resource_group import ResourceGroupOptions
from corral.domain.results import ResultNote, SchedulingResult, StatusTransitions, TransitionStatus
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import SessionId
from corral.store.admission import (
    ADMITTED,
    Eviction,
    NotReady,
    read_deactivated,
    read_not_ready,
)
from corral.store.database import Database
from corral.store.group_options import group_options
from corral.store.status_changes import StatusChange

_EVICT = TransitionStatus(SessionStatus.PENDING, KernelStatus.PENDING)
_CANCEL = TransitionStatus(SessionStatus.CANCELLED, KernelStatus.CANCELLED)


@dataclass(slots=True)
class AdmissionWork:
    """What one look found: the moves to make, the rows to write, when to look again."""

    changes: list[StatusChange] = field(default_factory=list)
    evictions: list[Eviction] = field(default_factory=list)
    # The events to append with the moves (evicted, requeued, deactivated), by session.
    events: dict[SessionId, list[tuple[str, dict[str, Any]]]] = field(default_factory=dict)
    next_due: datetime | None = None
    # The cause (KernelsReady reason) of each eviction, and how many sessions of the enabled
    # groups are deactivated (None: no group enables admission).
    causes: dict[SessionId, str] = field(default_factory=dict)
    deactivated: int | None = None


def enabled_groups(options: Mapping[str, Mapping[str, Any]]) -> dict[str, WaitForKernelsReady]:
    """The groups that enable all-or-nothing admission, with their options."""
    found: dict[str, WaitForKernelsReady] = {}
    for name, stored in options.items():
        raw = stored.get("wait_for_kernels_ready")
        if isinstance(raw, Mapping) and raw.get("enable"):
            found[name] = ResourceGroupOptions.model_validate(stored).wait_for_kernels_ready
    return found


class EvictNotReady:
    """Finds the sessions past their KernelsReady timeouts and the deactivated ones past their
    retention; declares its moves like a lifecycle handler, for the transition law."""

    def __init__(self, db: Database) -> None:
        self.db = db

    @classmethod
    def name(cls) -> str:
        return "EvictNotReady"

    @classmethod
    def status_transitions(cls) -> StatusTransitions:
        """Eviction and deactivation go back to PENDING (EXPIRED: a timeout, the agents that
        held it are remembered); a deactivated session past its retention is cancelled."""
        return StatusTransitions(success=None, expired=_EVICT, give_up=_CANCEL)

    async def due(self, now: datetime) -> AdmissionWork:
        """The moves due at `now` and the next moment something comes due."""
        work = AdmissionWork()
        async with self.db.read_statements() as conn:
            groups = enabled_groups(await group_options(self.db, conn))
            if not groups:
                return work
            not_ready = await read_not_ready(conn, groups)
            inactive = await read_deactivated(conn, groups)
        work.deactivated = len(inactive)
        deactivated = [row for row in inactive if groups[row[1]].deactivated_retention_s]
        # A session admitted after this look times out no earlier than its group's timeout.
        work.next_due = now + timedelta(seconds=min(o.timeout_s for o in groups.values()))
        evicted: dict[SessionId, ResultNote] = {}
        for session in not_ready:
            options = groups[session.group]
            limit = _limit_s(options, session.reason)
            if limit is None:
                continue
            at = session.since + timedelta(seconds=limit)
            if at > now:
                work.next_due = min(work.next_due, at)
                continue
            eviction, events = _evict(options, session, now, limit)
            work.evictions.append(eviction)
            work.causes[session.id] = session.reason or KernelsReadyReason.WAIT_FOR_START.value
            work.events[session.id] = events
            evicted[session.id] = ResultNote(
                FailureCause.KERNELS_READY_TIMEOUT.value, _message(session, limit, eviction)
            )
        if evicted:
            work.changes.append(
                StatusChange(
                    list(evicted),
                    self.name(),
                    SchedulingResult.EXPIRED,
                    frozenset(ADMITTED),
                    _EVICT,
                    notes=evicted,
                )
            )
        cancelled: dict[SessionId, ResultNote] = {}
        for sid, group, since in deactivated:
            keep_s = groups[group].deactivated_retention_s
            assert keep_s is not None  # only those of groups that keep them are here
            at = since + timedelta(seconds=keep_s)
            if at > now:
                work.next_due = min(work.next_due, at)
                continue
            cancelled[sid] = ResultNote(
                FailureCause.DEACTIVATED_RETENTION.value,
                f"cancelled after being kept deactivated for {keep_s}s "
                f"(deactivated_retention_s of resource group {group!r})",
            )
        if cancelled:
            work.changes.append(
                StatusChange(
                    list(cancelled),
                    self.name(),
                    SchedulingResult.GIVE_UP,
                    frozenset({SessionStatus.PENDING}),
                    _CANCEL,
                    notes=cancelled,
                )
            )
        return work


def _limit_s(options: WaitForKernelsReady, reason: str | None) -> int | None:
    """Seconds a session not ready for `reason` may stay so (None: no limit)."""
    if reason == KernelsReadyReason.WAIT_FOR_RECOVERY.value:
        return options.recovery_timeout_s
    return options.timeout_s


def _evict(
    options: WaitForKernelsReady, session: NotReady, now: datetime, limit_s: int
) -> tuple[Eviction, list[tuple[str, dict[str, Any]]]]:
    """The evicted session's new requeue state and the events that say so."""
    requeuing = options.requeuing
    count = session.requeue_count + 1
    first = session.first_evicted_at or now
    cause = session.reason or KernelsReadyReason.WAIT_FOR_START.value
    evicted = {"reason": KERNELS_READY_TIMEOUT, "cause": cause, "timeout_s": limit_s}
    events: list[tuple[str, dict[str, Any]]] = [(SESSION_EVICTED, evicted)]
    why = _deactivation(
        requeuing.backoff_limit_count, requeuing.backoff_limit_timeout_s, count, first, now
    )
    if why is not None:
        # Reset with the deactivation: reactivated, the session starts a fresh cycle (Kueue's
        # bug #2174 re-deactivated it at once because the count was kept).
        events.append((SESSION_DEACTIVATED, {"reason": why, "requeue_count": count - 1}))
        return Eviction(session.id, 0, None, None, False, KERNELS_READY_TIMEOUT), events
    at = requeue_time(requeuing, count, now, session.requeue_at)
    limit = requeuing.backoff_limit_count
    events.append(
        (SESSION_REQUEUED, {"requeue_count": count, "requeue_at": at.isoformat(), "of": limit})
    )
    return Eviction(session.id, count, at, first, True, KERNELS_READY_TIMEOUT), events


def _deactivation(
    limit_count: int | None,
    limit_timeout_s: int | None,
    count: int,
    first: datetime,
    now: datetime,
) -> str | None:
    """Why a session evicted for the `count`-th time is deactivated (None: it is requeued)."""
    if limit_count is not None and count > limit_count:
        return f"requeued {limit_count} time(s) already, the group's backoff_limit_count"
    if limit_timeout_s is not None and (now - first).total_seconds() >= limit_timeout_s:
        return (
            f"not ready for {limit_timeout_s}s since its first eviction, the group's "
            "backoff_limit_timeout_s"
        )
    return None


def _message(session: NotReady, limit_s: int, eviction: Eviction) -> str:
    cause = session.reason or KernelsReadyReason.WAIT_FOR_START.value
    what = f"{KERNELS_READY_TIMEOUT}: kernels not all ready within {limit_s}s ({cause})"
    if not eviction.active:
        return f"{what}; deactivated, `corral session activate` queues it again"
    assert eviction.requeue_at is not None
    return f"{what}; requeue {eviction.requeue_count} after {eviction.requeue_at.isoformat()}"


def admission_events(
    work: AdmissionWork,
    moved: Mapping[SessionId, object],
    owners: Mapping[SessionId, Any],
    now: datetime,
) -> list[Event]:
    """The events of the evictions that were applied (a session moved meanwhile has none)."""
    return [
        Event(
            kind=kind,
            entity_type=SESSION_ENTITY,
            entity_id=str(sid),
            owner_id=owners.get(sid),
            payload=payload,
            created_at=now,
        )
        for sid, events in work.events.items()
        if sid in moved
        for kind, payload in events
    ]
