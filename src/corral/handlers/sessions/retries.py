"""DispatchRetries: a failed BATCH session with retries left gets its retry (spec document 5).

Its targets are the ended sessions with a retry policy whose retry is not decided yet, read
through a partial index (a session without a policy never is one). Those that succeeded, most
of them, are decided SUCCEEDED by one guarded statement, unread. For a batch of the rest it
decides each (`domain.retry.decide`, pure), then in one transaction records the decisions on
the parents (guarded: a decision is written once) and creates the children of those it
recorded: PENDING sessions with the parent's spec, `parent_session_id`, `retry_count + 1`, the
cause and the policy, and a deterministic creation_id. The delay is the child's `starts_at`
(the parent's end plus the backoff), which the scheduler honours: it is in the database from
the moment of the decision, so a manager that dies during the delay loses nothing.

It moves no session's status (the spec's "no RETRYING status"): the parent stays where it
ended, the child starts PENDING as every submission does. Its history rows on the parent say
what was decided; its events are `session.retry_scheduled` and `session.retry_exhausted`
(unless the policy turns them off), and the child's `session.created` is the audit entry of
the dispatch. While an admin has paused retries (`store.retries.RetrySwitch`), nothing is
decided: the decisions wait, and are made when retries resume.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.events import (
    SESSION_CREATED,
    SESSION_ENTITY,
    SESSION_RETRY_EXHAUSTED,
    SESSION_RETRY_SCHEDULED,
    Event,
)
from corral.domain.record import record
from corral.domain.results import ResultNote, SchedulingResult, StatusTransitions
from corral.domain.retry.decide import EndedAttempt, RetryDecision, RetryVerdict, decide
from corral.domain.retry.policy import RetryPolicy
from corral.domain.session import ArrayPlace, NewSession
from corral.domain.status import SessionStatus
from corral.domain.types import SessionId, UserId, new_session_id
from corral.store.database import Database
from corral.store.events import append_events
from corral.store.history import record_session_history
from corral.store.retries import (
    any_undecided,
    read_retry_switch,
    read_undecided,
    record_decisions,
    record_successes,
)
from corral.store.sessions import insert_sessions

# Sessions decided per run; a run that fills it is due again at once.
BATCH = 1000


@record
class Dispatched:
    """What one run decided and wrote."""

    paused: bool = False
    looked_at: int = 0
    # Per decision recorded by this run but the successes (written in one statement, counted
    # in `looked_at` and `recovered`): (session, verdict). Others were decided elsewhere.
    decided: tuple[tuple[SessionId, RetryVerdict], ...] = ()
    children: tuple[SessionId, ...] = ()  # the retries created
    # How many of the succeeded sessions were retries (the chains that recovered).
    recovered: int = 0
    events: tuple[Event, ...] = ()
    full: bool = False  # the batch was full: more may be waiting
    # The earliest start of a retry created (the scheduler's next due time).
    next_start: datetime | None = None


class DispatchRetries:
    """Decides the retries of ended sessions, creating the children, in batches."""

    def __init__(
        self,
        db: Database,
        *,
        batch: int = BATCH,
        notify: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.db = db
        self.batch = batch
        self.notify = notify
        self.rng = rng

    @classmethod
    def name(cls) -> str:
        return "DispatchRetries"

    @classmethod
    def status_transitions(cls) -> StatusTransitions:
        """None: a decision moves no session (the parent has ended; the child is new and
        PENDING), so only history is written."""
        return StatusTransitions()

    async def dispatch(self, now: datetime) -> Dispatched:
        """Decide the ended sessions waiting for it (up to a batch); create their retries."""
        async with self.db.read_statements() as conn:
            switch = await read_retry_switch(conn)
            waiting = not switch.paused and await any_undecided(conn)
        if switch.paused:
            return Dispatched(paused=True)
        if not waiting:  # every ending of a cluster wakes this task, policy or not
            return Dispatched()
        async with self.db.transaction() as conn:
            succeeded = await record_successes(conn, self.batch)
        recovered = sum(1 for count in succeeded if count > 0)
        if len(succeeded) >= self.batch:
            return Dispatched(looked_at=len(succeeded), recovered=recovered, full=True)
        async with self.db.read_statements() as conn:
            rows = await read_undecided(conn, self.batch)
        if not rows:
            return Dispatched(looked_at=len(succeeded), recovered=recovered)
        verdicts = {SessionId(row["id"]): decide(_ended(row), rng=self.rng) for row in rows}
        by_id = {SessionId(row["id"]): row for row in rows}
        async with self.db.transaction() as conn:
            written = await record_decisions(
                conn, self.db.dialect, {sid: v.decision for sid, v in verdicts.items()}
            )
            decided = [(sid, verdicts[sid]) for sid in sorted(written)]
            children = [
                _child(by_id[sid], verdict)
                for sid, verdict in decided
                if verdict.decision is RetryDecision.SCHEDULED
            ]
            inserted = await insert_sessions(conn, children, now)
            await self._history(conn, decided, by_id, now)
            events = await append_events(
                conn,
                self._events(decided, by_id, children, inserted, now),
                now,
                notify=self.notify,
            )
        recovered += sum(
            1
            for sid, v in decided
            if v.decision is RetryDecision.SUCCEEDED and by_id[sid]["retry_count"] > 0
        )
        starts = [c.starts_at for c in children if c.starts_at is not None]
        return Dispatched(
            looked_at=len(succeeded) + len(rows),
            decided=tuple(decided),
            children=tuple(c.id for c in children),
            recovered=recovered,
            events=tuple(events),
            full=len(rows) >= self.batch,
            next_start=min(starts, default=None),
        )

    async def _history(
        self,
        conn: AsyncConnection,
        decided: Sequence[tuple[SessionId, RetryVerdict]],
        by_id: Mapping[SessionId, Mapping[str, Any]],
        now: datetime,
    ) -> None:
        """A history row on each parent retried or exhausted, saying so (statuses unchanged)."""
        for outcome, decision in (
            (SchedulingResult.SUCCESS, RetryDecision.SCHEDULED),
            (SchedulingResult.GIVE_UP, RetryDecision.EXHAUSTED),
        ):
            notes = {
                sid: ResultNote(
                    verdict.cause.value if verdict.cause is not None else "",
                    _said(by_id[sid], verdict),
                )
                for sid, verdict in decided
                if verdict.decision is decision
            }
            await record_session_history(
                conn,
                self.db.dialect,
                list(notes),
                phase=self.name(),
                result=outcome.value,
                to_status=None,
                now=now,
                moving=False,
                notes=notes,
            )

    def _events(
        self,
        decided: Sequence[tuple[SessionId, RetryVerdict]],
        by_id: Mapping[SessionId, Mapping[str, Any]],
        children: Sequence[NewSession],
        inserted: Sequence[Mapping[str, Any]],
        now: datetime,
    ) -> list[Event]:
        events: list[Event] = []
        child_of = {
            c.parent_session_id: (c, row) for c, row in zip(children, inserted, strict=True)
        }
        for sid, verdict in decided:
            row = by_id[sid]
            owner = UserId(row["owner_id"])
            attempts = row["max_retries"] + 1
            emit = (row["retry_policy"] or {}).get("emit_retry_events", True)
            cause = verdict.cause.value if verdict.cause is not None else None
            if verdict.decision is RetryDecision.SCHEDULED:
                child, written = child_of[sid]
                # The audit entry of the dispatch, written whatever the policy says of events.
                events.append(
                    _event(
                        SESSION_CREATED,
                        child.id,
                        owner,
                        now,
                        status=SessionStatus.PENDING.value,
                        number=written["number"],
                        name=child.name,
                        resource_group=child.resource_group,
                        cluster_size=child.cluster_size,
                        retry={
                            "auto": True,
                            "parent_session_id": str(sid),
                            "attempt": child.retry_count + 1,
                            "of": attempts,
                            "cause": cause,
                            "not_before": child.starts_at,
                        },
                    )
                )
                if emit:
                    events.append(
                        _event(
                            SESSION_RETRY_SCHEDULED,
                            sid,
                            owner,
                            now,
                            cause=cause,
                            attempt=child.retry_count + 1,
                            of=attempts,
                            delay_s=round(verdict.delay_s or 0.0, 3),
                            not_before=child.starts_at,
                            retry_session_id=str(child.id),
                            retry_number=written["number"],
                        )
                    )
            elif verdict.decision is RetryDecision.EXHAUSTED and emit:
                events.append(
                    _event(SESSION_RETRY_EXHAUSTED, sid, owner, now, cause=cause, attempts=attempts)
                )
        return events


def _ended(row: Mapping[str, Any]) -> EndedAttempt:
    policy = row["retry_policy"]
    return EndedAttempt(
        id=row["id"],
        type=row["type"],
        status=SessionStatus(row["status"]),
        result=row["result"],
        failure_cause=row["failure_cause"],
        retry_count=row["retry_count"],
        max_retries=row["max_retries"],
        policy=None if policy is None else RetryPolicy.model_validate(policy),
        creation_id=row["creation_id"],
        ended_at=row["terminated_at"] or row["status_changed_at"],
    )


def _child(row: Mapping[str, Any], verdict: RetryVerdict) -> NewSession:
    """The retry of the session `row`: its spec again, one further down the chain."""
    array = None
    if row["array_id"] is not None:
        array = ArrayPlace(row["array_id"], row["array_index"], row["array_throttle"])
    return NewSession(
        id=new_session_id(),
        owner_id=row["owner_id"],
        type=row["type"],
        resource_group=row["resource_group"],
        cluster_mode=row["cluster_mode"],
        cluster_size=row["cluster_size"],
        spec=row["spec"],
        # Every kernel of a session asks the same today (`sessions.kernel_slots`).
        kernel_slots=row["kernel_slots"],
        name=row["name"],
        priority=row["priority"],
        project=row["project"],
        creation_id=verdict.child_creation_id,
        starts_at=verdict.not_before,
        # Its parent's dependencies were met when the parent started, and stay met.
        dependencies=(),
        time_limit_s=row["time_limit_s"],
        array=array,
        max_retries=row["max_retries"],
        retry_policy=row["retry_policy"],
        parent_session_id=row["id"],
        retry_count=row["retry_count"] + 1,
        retry_cause=verdict.cause.value if verdict.cause is not None else None,
    )


def _said(row: Mapping[str, Any], verdict: RetryVerdict) -> str:
    attempt, attempts = row["retry_count"] + 1, row["max_retries"] + 1
    cause = verdict.cause.value if verdict.cause is not None else "a failure"
    if verdict.decision is RetryDecision.SCHEDULED:
        return (
            f"attempt {attempt} of {attempts} failed ({cause}); "
            f"attempt {attempt + 1} in {verdict.delay_s or 0.0:.0f} s"
        )
    return f"attempt {attempt} of {attempts} failed ({cause}); retries exhausted"


def _event(kind: str, session_id: SessionId, owner: UserId, now: datetime, **payload: Any) -> Event:
    return Event(
        id=None,
        kind=kind,
        entity_type=SESSION_ENTITY,
        entity_id=str(session_id),
        owner_id=owner,
        payload=payload,
        created_at=now,
    )
