"""Judging a handler's result: the coordinator's pure decision, as spec document 1 defines it.

Handlers only sort their targets into successes, failures and skips. The coordinator alone
decides what a failure means, first match wins: GIVE_UP when the attempts in this phase reach
the handler's limit (or the failure is permanent, a corral addition), then EXPIRED when the
time spent in the phase exceeds the handler's timeout, else NEED_RETRY. A session neither
succeeded nor failed may still expire; a skip never counts as an attempt.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from corral.domain.failure_causes import FailureCause
from corral.domain.record import record
from corral.domain.results import HandlerResult, ResultNote, SchedulingResult, StatusTransitions
from corral.domain.session import SessionWithKernels
from corral.domain.status import SessionStatus
from corral.domain.types import SessionId
from corral.store.status_changes import StatusChange

DEFAULT_MAX_ATTEMPTS = 5  # the spec README's default limit per phase


@record
class PhaseLimits:
    """How many failed attempts, and how long, a handler may spend on one session's phase."""

    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    timeout_s: float | None = None  # None: the phase never expires


def judge_failure(
    *, attempts: int, elapsed_s: float, limits: PhaseLimits, permanent: bool = False
) -> SchedulingResult:
    """What one failed attempt means: GIVE_UP, then EXPIRED, else NEED_RETRY (first match)."""
    if permanent or attempts >= limits.max_attempts:
        return SchedulingResult.GIVE_UP
    if limits.timeout_s is not None and elapsed_s > limits.timeout_s:
        return SchedulingResult.EXPIRED
    return SchedulingResult.NEED_RETRY


def judge(
    *,
    phase: str,
    expected: frozenset[SessionStatus],
    transitions: StatusTransitions,
    targets: Sequence[SessionWithKernels],
    result: HandlerResult,
    limits: Callable[[SessionWithKernels], PhaseLimits],
    now: datetime,
) -> list[StatusChange]:
    """Turn a handler's result over `targets` into the guarded changes to apply, by outcome."""
    by_id = {s.id: s for s in targets}
    buckets: dict[SchedulingResult, list[SessionId]] = {r: [] for r in SchedulingResult}
    notes: dict[SessionId, ResultNote] = {}

    succeeded = set(result.successes)
    buckets[SchedulingResult.SUCCESS].extend(sid for sid in result.successes if sid in by_id)
    failed = set(result.failures)
    for sid in result.failures:
        session = by_id.get(sid)
        if session is None or sid in succeeded:
            continue
        note = result.notes.get(sid)
        attempts = (session.phase_attempts if session.phase == phase else 0) + 1
        outcome = judge_failure(
            attempts=attempts,
            elapsed_s=(now - session.status_changed_at).total_seconds(),
            limits=limits(session),
            permanent=note is not None and note.permanent,
        )
        buckets[outcome].append(sid)
        if note is not None:
            notes[sid] = note

    skipped = set(result.skipped)
    for session in targets:
        if session.id in succeeded or session.id in failed:
            continue
        timeout = limits(session).timeout_s
        elapsed = (now - session.status_changed_at).total_seconds()
        if timeout is not None and elapsed > timeout:
            buckets[SchedulingResult.EXPIRED].append(session.id)
            notes[session.id] = ResultNote(
                FailureCause.PHASE_TIMEOUT,
                f"spent {elapsed:.0f} s in {phase}, the limit is {timeout:.0f} s",
            )
        elif session.id in skipped:
            buckets[SchedulingResult.SKIPPED].append(session.id)
            if session.id in result.notes:
                notes[session.id] = result.notes[session.id]

    changes: list[StatusChange] = []
    for outcome, ids in buckets.items():
        if not ids:
            continue
        changes.append(
            StatusChange(
                session_ids=ids,
                phase=phase,
                result=outcome,
                expected=expected,
                target=transitions.for_result(outcome),
                notes={sid: notes[sid] for sid in ids if sid in notes},
                count_attempt=outcome is SchedulingResult.NEED_RETRY,
            )
        )
    return changes
