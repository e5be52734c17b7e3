"""SessionController: submitting and terminating sessions (Mark-Execute, spec document 4).

The controller never schedules or talks to agents. It validates, writes the intent as statuses
in one transaction together with the events that describe it, sets a hint so the coordinator
wakes at once, and returns. A lost hint only costs latency: the coordinator's long loop finds
the rows anyway.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.controller._group_commit import GroupCommit
from corral.coordination.hints import Hint
from corral.domain.arrays import DEFAULT_MAX_ARRAY_SIZE, ArraySpec, parse_array
from corral.domain.events import SESSION_ENTITY, Event
from corral.domain.outcome import USER_CANCELLED
from corral.domain.record import record
from corral.domain.resource_group import ResourceGroupOptions
from corral.domain.results import ResultNote, SchedulingResult, TransitionStatus
from corral.domain.session import ArrayPlace, NewSession
from corral.domain.spec import SessionSpec
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import Clock, SessionId, UserId, new_session_id, utcnow
from corral.infra.events import EventBus
from corral.infra.hints import HintBus
from corral.store._direct import DirectStatement
from corral.store._sql import in_param, payload
from corral.store.database import Database
from corral.store.events import append_events, append_session_moves
from corral.store.group_options import forget_group_options, group_options_naming
from corral.store.sessions import insert_sessions
from corral.store.status_changes import AppliedChanges, StatusChange, apply_changes
from corral.store.tables import sessions
from corral.store.uploads import missing_uploads
from corral.store.users import read_principal

PHASE_TERMINATE = "terminate"
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
# The spec's fields kept in the session's `spec` column, for agents (the others are columns).
_AGENT_SPEC_FIELDS = {"image", "command", "env", "resources", "type", "workdir", "upload"}

# Run for every submission: built once, run directly (`store._direct`).
_OWNER = sa.bindparam("owner", type_=sessions.c.owner_id.type)
_BY_CREATION_IDS = DirectStatement(
    lambda dialect: sa.select(sessions.c.creation_id, sessions.c.id).where(
        sessions.c.owner_id == _OWNER,
        in_param(dialect, sessions.c.creation_id, "creation_ids"),
    )
)
_OWN_SESSIONS = DirectStatement(
    lambda dialect: sa.select(sessions.c.id).where(
        in_param(dialect, sessions.c.id, "ids"), sessions.c.owner_id == _OWNER
    )
)


class SubmissionError(ValueError):
    """A request the controller refuses; `field` names what was wrong (for problem details)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class SubmissionForbiddenError(SubmissionError):
    """A valid request its owner may not make (a group not open to them, a priority above
    what the group lets users give); `field` names what needs an admin."""


@record
class Submitted:
    """The session a submission stands for; `created` is False when creation_id matched.

    `written` is the session's row as this submission wrote it, with its kernel rows under
    `kernels` (see `insert_sessions`); None when it was created before.
    """

    session_id: SessionId
    created: bool
    written: Mapping[str, Any] | None = field(default=None, compare=False)


@record
class SubmittedArray:
    """The elements of a job array, in index order; `array_id` is its first element's id."""

    array_id: SessionId
    indexes: tuple[int, ...]
    elements: tuple[Submitted, ...]
    throttle: int | None

    @property
    def created(self) -> bool:
        """Whether this submission created any element (False: all were created before)."""
        return any(e.created for e in self.elements)


@record
class ArrayRequest:
    """The array `enqueue_many`'s specs form: element i has index `indexes[i]`."""

    indexes: tuple[int, ...]
    throttle: int | None


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
        max_array_size: int = DEFAULT_MAX_ARRAY_SIZE,
    ) -> None:
        self.db = db
        self.max_array_size = max_array_size
        self.hints = hints
        self.events = events
        self.clock = clock
        # Where the bus can, events go out with the commit that appends them (not published).
        self._notify = events.commit_channel if events is not None else None
        # Submissions arriving together (API requests) share one transaction.
        self._submissions: GroupCommit[tuple[SessionSpec, UserId], Submitted] = GroupCommit(
            self._enqueue_together
        )

    async def enqueue(self, spec: SessionSpec, owner: UserId) -> Submitted:
        """Write the session and its kernels as PENDING, set the scheduling hint, return.

        The same `creation_id` from the same owner returns the session it first created.
        Concurrent calls are written together (group commit); each gets its own answer, and a
        refused spec fails only its own call.
        """
        return await self._submissions.submit((spec, owner))

    async def _enqueue_together(
        self, items: Sequence[tuple[SessionSpec, UserId]]
    ) -> list[Submitted | BaseException]:
        by_owner: dict[UserId, list[int]] = {}
        for index, (_, owner) in enumerate(items):
            by_owner.setdefault(owner, []).append(index)
        results: list[Submitted | BaseException] = [RuntimeError("not submitted")] * len(items)
        for owner, indexes in by_owner.items():
            specs = [items[i][0] for i in indexes]
            try:
                done: list[Submitted | BaseException] = list(await self.enqueue_many(specs, owner))
            except SubmissionError:
                # One refused spec refuses the batch: submit each alone to find whose it is.
                done = []
                for spec in specs:
                    try:
                        done.extend(await self.enqueue_many([spec], owner))
                    except SubmissionError as exc:
                        done.append(exc)
            for index, result in zip(indexes, done, strict=True):
                results[index] = result
        return results

    async def enqueue_array(self, spec: ArraySpec, owner: UserId) -> SubmittedArray:
        """Submit a job array: one session per index, all in one transaction (all or none).

        Refused (SubmissionError on `array`) when it has more elements than `max_array_size`.
        Each element's creation_id is the array's with its index appended, so the same request
        again returns the same array.
        """
        parsed = parse_array(spec.array)
        if parsed.upper_count > self.max_array_size:
            raise SubmissionError(
                "array",
                f"{spec.array!r} has {parsed.upper_count} elements; an array may have at most "
                f"{self.max_array_size} (the manager's max_array_size); split it",
            )
        indexes = tuple(parsed.indexes())
        elements = await self.enqueue_many(
            [spec.element(i) for i in indexes],
            owner,
            array=ArrayRequest(indexes, parsed.throttle),
        )
        return SubmittedArray(elements[0].session_id, indexes, tuple(elements), parsed.throttle)

    async def enqueue_many(
        self,
        specs: Sequence[SessionSpec],
        owner: UserId,
        *,
        array: ArrayRequest | None = None,
    ) -> list[Submitted]:
        """Submit several sessions in one transaction (all or none); one result per spec.

        A `creation_id` the owner used before (or earlier in the same batch) returns that
        session instead of creating one. With `array`, the specs are its elements in order.
        """
        for attempt in range(2):  # a second pass only after a unique or foreign key refused
            created = await self._by_creation_ids(
                owner, {s.creation_id for s in specs if s.creation_id is not None}
            )
            results: list[Submitted | NewSession] = []  # the new ones until they are written
            new: list[NewSession] = []
            array_id: SessionId | None = None  # the first element's, created now or before
            for position, spec in enumerate(specs):
                if spec.creation_id is not None and spec.creation_id in created:
                    results.append(Submitted(created[spec.creation_id], created=False))
                    array_id = array_id or created[spec.creation_id]
                    continue
                session_id = new_session_id()
                place = None
                if array is not None:
                    array_id = array_id or session_id
                    place = ArrayPlace(array_id, array.indexes[position], array.throttle)
                session = _new_session(spec, owner, session_id, place)
                if spec.creation_id is not None:
                    created[spec.creation_id] = session.id
                new.append(session)
                results.append(session)
            if not new:
                return [r for r in results if isinstance(r, Submitted)]
            now = self.clock()
            try:
                async with self.db.transaction() as conn:
                    options = await self._check_references(conn, specs, owner)
                    new = [_time_limited(n, options[n.resource_group]) for n in new]
                    rows = await insert_sessions(conn, new, now)
                    created_events = [
                        _created_event(n, row["number"], now)
                        for n, row in zip(new, rows, strict=True)
                    ]
                    events = await append_events(conn, created_events, now, notify=self._notify)
            except sa.exc.IntegrityError:
                # A concurrent submission with the same creation_id won the unique index, or
                # another manager deleted a group moments ago that the kept options still
                # hold: the second pass finds the session, or refuses the group by name.
                if attempt:
                    raise
                forget_group_options(self.db)
                continue
            await self.hints.set_after_commit(Hint.SCHEDULE)
            if self.events is not None and self._notify is None:
                await self.events.publish_after_commit(events)
            written = {row["id"]: row for row in rows}
            return [
                r if isinstance(r, Submitted) else Submitted(r.id, True, written[r.id])
                for r in results
            ]
        raise AssertionError("unreachable: the second pass returns or raises")

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
                records_cause=True,
            ),
        ]
        now = self.clock()
        appended: list[Event] = []

        async def record(conn: AsyncConnection, applied: AppliedChanges) -> None:
            moves = applied.moved()
            reasons = dict.fromkeys(moves, reason)
            appended.extend(
                await append_session_moves(
                    conn,
                    self.db.dialect,
                    moves,
                    reasons,
                    now,
                    owners=applied.owners,
                    notify=self._notify,
                )
            )

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
            await self.hints.set_after_commit(Hint.TERMINATE)
        if self.events is not None and appended and self._notify is None:
            await self.events.publish_after_commit(appended)
        return outcome

    async def _by_creation_ids(
        self, owner: UserId, creation_ids: Collection[str]
    ) -> dict[str, SessionId]:
        if not creation_ids:
            return {}
        params = {"owner": owner, "creation_ids": payload(self.db.dialect, list(creation_ids))}
        async with self.db.read_statements() as conn:
            rows = await _BY_CREATION_IDS.rows(conn, params)
            return {creation_id: SessionId(sid) for creation_id, sid in rows}

    async def _check_references(
        self, conn: AsyncConnection, specs: Sequence[SessionSpec], owner: UserId
    ) -> dict[str, ResourceGroupOptions]:
        """Refuse unknown groups and dependencies and limits over a group's; the groups' options."""
        dialect = self.db.dialect
        groups = {spec.resource_group for spec in specs}
        stored = await group_options_naming(self.db, conn, groups)
        for group in sorted(groups - stored.keys()):
            raise SubmissionError("resource_group", f"resource group {group!r} does not exist")
        options = {group: ResourceGroupOptions.model_validate(stored[group]) for group in groups}
        await _check_access(conn, specs, owner, options)
        for spec in specs:
            refused = options[spec.resource_group].check_time_limit(spec.time_limit_s)
            if refused is not None:
                raise SubmissionError("time_limit_s", refused)
        digests = {spec.upload for spec in specs if spec.upload is not None}
        for digest in sorted(
            await missing_uploads(conn, dialect, owner, digests) if digests else ()
        ):
            raise SubmissionError(
                "upload",
                f"you have no upload {digest}; send the directory first (`corral run --upload "
                "DIR` does, or PUT /v1/uploads/{digest})",
            )
        wanted = {dep.session for spec in specs for dep in spec.dependencies}
        if not wanted:
            return options
        found = set(
            await _OWN_SESSIONS.scalars(conn, {"ids": payload(dialect, wanted), "owner": owner})
        )
        missing = sorted(str(dep) for dep in wanted - found)
        if missing:
            raise SubmissionError(
                "dependencies", f"no session of yours has the id {', '.join(missing)}"
            )
        return options


async def _check_access(
    conn: AsyncConnection,
    specs: Sequence[SessionSpec],
    owner: UserId,
    options: Mapping[str, ResourceGroupOptions],
) -> None:
    """Refuse a group not open to the owner, or a priority above what it lets users give.

    The owner's name and role are read only when some group restricts the submission.
    """
    restricted = [
        spec
        for spec in specs
        if options[spec.resource_group].allowed_users is not None
        or spec.priority > options[spec.resource_group].max_user_priority
    ]
    if not restricted:
        return
    who = await read_principal(conn, owner)
    if who is None:
        raise SubmissionForbiddenError("owner", f"no user has the id {owner}")
    for spec in restricted:
        group = options[spec.resource_group]
        refused = group.access_refusal(spec.resource_group, who.name, who.is_admin)
        if refused is not None:
            raise SubmissionForbiddenError(
                "resource_group", f"{refused}; ask an admin for access, or choose another group"
            )
        refused = group.priority_refusal(spec.resource_group, spec.priority, who.is_admin)
        if refused is not None:
            raise SubmissionForbiddenError(
                "priority", f"{refused}; ask for {group.max_user_priority} or less"
            )


def _time_limited(new: NewSession, options: ResourceGroupOptions) -> NewSession:
    """`new` with the time limit its group gives it (its own, else the group's default)."""
    limit = options.time_limit_for(new.time_limit_s)
    return new if limit == new.time_limit_s else dataclasses.replace(new, time_limit_s=limit)


def _new_session(
    spec: SessionSpec,
    owner: UserId,
    session_id: SessionId | None = None,
    array: ArrayPlace | None = None,
) -> NewSession:
    return NewSession(
        id=session_id or new_session_id(),
        owner_id=owner,
        type=spec.type.value,
        resource_group=spec.resource_group,
        cluster_mode=spec.cluster_mode.value,
        cluster_size=spec.cluster_size,
        spec=spec.model_dump(mode="json", include=_AGENT_SPEC_FIELDS, exclude_none=True),
        kernel_slots=spec.resources.to_milli(),
        name=spec.name,
        priority=spec.priority,
        creation_id=spec.creation_id,
        starts_at=spec.starts_at,
        dependencies=tuple((dep.session, dep.kind) for dep in spec.dependencies),
        time_limit_s=spec.time_limit_s,
        array=array,
    )


def _created_event(new: NewSession, number: int, now: datetime) -> Event:
    return Event(
        id=None,
        kind="session.created",
        entity_type=SESSION_ENTITY,
        entity_id=str(new.id),
        owner_id=new.owner_id,
        payload={
            "status": SessionStatus.PENDING.value,
            "number": number,
            "name": new.name,
            "resource_group": new.resource_group,
            "cluster_size": new.cluster_size,
        },
        created_at=now,
    )
