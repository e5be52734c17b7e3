"""SessionController: submitting and terminating sessions (Mark-Execute, spec document 4).

The controller never schedules or talks to agents. It validates, writes the intent as statuses
in one transaction together with the events that describe it, sets a hint so the coordinator
wakes at once, and returns. A lost hint only costs latency: the coordinator's long loop finds
the rows anyway.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.coordination.hints import Hint
from corral.domain.events import Event
from corral.domain.results import ResultNote, SchedulingResult, TransitionStatus
from corral.domain.session import NewSession
from corral.domain.spec import SessionSpec
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import Clock, SessionId, UserId, utcnow
from corral.infra.events import EventBus
from corral.infra.hints import HintBus
from corral.store._sql import in_values
from corral.store.database import Database
from corral.store.events import append_events, append_session_moves
from corral.store.sessions import insert_sessions
from corral.store.status_changes import AppliedChanges, StatusChange, apply_changes
from corral.store.tables import resource_groups, sessions

PHASE_TERMINATE = "terminate"
USER_CANCELLED = "user_cancelled"
# Statuses a terminate request moves to TERMINATING (their kernels may hold agent resources).
_STARTED = frozenset(
    {
        SessionStatus.SCHEDULED,
        SessionStatus.PREPARING,
        SessionStatus.PREPARED,
        SessionStatus.CREATING,
        SessionStatus.RUNNING,
    }
)


class SubmissionError(ValueError):
    """A request the controller refuses; `field` names what was wrong (for problem details)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class Submitted:
    """The session a submission stands for; `created` is False when creation_id matched."""

    session_id: SessionId
    created: bool


@dataclass(slots=True)
class TerminateOutcome:
    """What a terminate request did with each session it named."""

    cancelled: list[SessionId] = field(default_factory=list)  # were PENDING: CANCELLED now
    terminating: list[SessionId] = field(default_factory=list)  # TERMINATING now
    unchanged: list[SessionId] = field(default_factory=list)  # already ending or ended: a no-op


class SessionController:
    """Submits and terminates sessions: mark in the database, set a hint, return."""

    def __init__(
        self,
        db: Database,
        hints: HintBus,
        events: EventBus | None = None,
        *,
        clock: Clock = utcnow,
    ) -> None:
        self.db = db
        self.hints = hints
        self.events = events
        self.clock = clock

    async def enqueue(self, spec: SessionSpec, owner: UserId) -> Submitted:
        """Write the session and its kernels as PENDING, set the scheduling hint, return.

        The same `creation_id` from the same owner returns the session it first created.
        """
        if spec.creation_id is not None:
            existing = await self._by_creation_id(owner, spec.creation_id)
            if existing is not None:
                return Submitted(existing, created=False)
        now = self.clock()
        new = _new_session(spec, owner)
        try:
            async with self.db.transaction() as conn:
                await self._check_references(conn, spec, owner)
                await insert_sessions(conn, [new], now)
                created = await append_events(conn, [_created_event(new, spec, now)], now)
        except sa.exc.IntegrityError:
            # A concurrent submission with the same creation_id won the unique index.
            if spec.creation_id is None:
                raise
            existing = await self._by_creation_id(owner, spec.creation_id)
            if existing is None:
                raise
            return Submitted(existing, created=False)
        await self.hints.set(Hint.SCHEDULE)
        if self.events is not None:
            await self.events.publish(created)
        return Submitted(new.id, created=True)

    async def mark_terminate(
        self, session_ids: Collection[SessionId], reason: str
    ) -> TerminateOutcome:
        """PENDING sessions become CANCELLED, started ones TERMINATING; ended ones are a no-op."""
        ids = list(dict.fromkeys(session_ids))
        note = {sid: ResultNote(USER_CANCELLED, reason) for sid in ids}
        changes = [
            StatusChange(
                ids,
                PHASE_TERMINATE,
                SchedulingResult.SUCCESS,
                frozenset({SessionStatus.PENDING}),
                TransitionStatus(SessionStatus.CANCELLED, KernelStatus.CANCELLED),
                notes=note,
            ),
            StatusChange(
                ids,
                PHASE_TERMINATE,
                SchedulingResult.SUCCESS,
                _STARTED,
                TransitionStatus(SessionStatus.TERMINATING),
                notes=note,
            ),
        ]
        now = self.clock()
        appended: list[Event] = []

        async def record(conn: AsyncConnection, applied: AppliedChanges) -> None:
            moves = applied.moved()
            reasons = dict.fromkeys(moves, reason)
            appended.extend(await append_session_moves(conn, self.db.dialect, moves, reasons, now))

        applied = await apply_changes(self.db, changes, now, on_applied=record)
        outcome = TerminateOutcome()
        for sid in ids:
            after = applied.sessions.get(sid)
            if after is None:
                outcome.unchanged.append(sid)
            elif after[1] is SessionStatus.CANCELLED:
                outcome.cancelled.append(sid)
            else:
                outcome.terminating.append(sid)
        if outcome.terminating:
            await self.hints.set(Hint.TERMINATE)
        if self.events is not None and appended:
            await self.events.publish(appended)
        return outcome

    async def _by_creation_id(self, owner: UserId, creation_id: str) -> SessionId | None:
        async with self.db.read() as conn:
            found = await conn.scalar(
                sa.select(sessions.c.id).where(
                    sessions.c.owner_id == owner, sessions.c.creation_id == creation_id
                )
            )
        return SessionId(found) if found is not None else None

    async def _check_references(
        self, conn: AsyncConnection, spec: SessionSpec, owner: UserId
    ) -> None:
        group = await conn.scalar(
            sa.select(resource_groups.c.name).where(resource_groups.c.name == spec.resource_group)
        )
        if group is None:
            raise SubmissionError(
                "resource_group", f"resource group {spec.resource_group!r} does not exist"
            )
        if not spec.dependencies:
            return
        found = set(
            (
                await conn.execute(
                    sa.select(sessions.c.id).where(
                        in_values(self.db.dialect, sessions.c.id, spec.dependencies),
                        sessions.c.owner_id == owner,
                    )
                )
            ).scalars()
        )
        missing = [str(dep) for dep in spec.dependencies if dep not in found]
        if missing:
            raise SubmissionError(
                "dependencies", f"no session of yours has the id {', '.join(missing)}"
            )


def _new_session(spec: SessionSpec, owner: UserId) -> NewSession:
    return NewSession(
        id=SessionId(uuid.uuid4()),
        owner_id=owner,
        type=spec.type.value,
        resource_group=spec.resource_group,
        cluster_mode=spec.cluster_mode.value,
        cluster_size=spec.cluster_size,
        spec=spec.model_dump(mode="json", include={"image", "command", "env", "resources", "type"}),
        kernel_slots=spec.resources.to_milli(),
        name=spec.name,
        priority=spec.priority,
        creation_id=spec.creation_id,
        starts_at=spec.starts_at,
        dependencies=tuple(spec.dependencies),
    )


def _created_event(new: NewSession, spec: SessionSpec, now: datetime) -> Event:
    return Event(
        id=None,
        kind="session.created",
        entity_type="session",
        entity_id=str(new.id),
        owner_id=new.owner_id,
        payload={
            "status": SessionStatus.PENDING.value,
            "name": spec.name,
            "resource_group": spec.resource_group,
            "cluster_size": spec.cluster_size,
        },
        created_at=now,
    )
