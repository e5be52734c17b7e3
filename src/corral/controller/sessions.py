"""SessionController: submitting and terminating sessions (Mark-Execute, spec document 4).

The controller never schedules or talks to agents. It validates, writes the intent as statuses
in one transaction together with the events that describe it, sets a hint so the coordinator
wakes at once, and returns. A lost hint only costs latency: the coordinator's long loop finds
the rows anyway.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.controller._group_commit import GroupCommit
from corral.coordination.hints import Hint
from corral.coordination.quarantine import Quarantine
from corral.domain.arrays import DEFAULT_MAX_ARRAY_SIZE, ArraySpec, parse_array
from corral.domain.events import SESSION_ACTIVATED, SESSION_CREATED, SESSION_ENTITY, Event
from corral.domain.idempotency import KEY_FIELD, differing_fields, request_fingerprint
from corral.domain.outcome import USER_CANCELLED
from corral.domain.record import record
from corral.domain.resource_group import ResourceGroupOptions
from corral.domain.results import ResultNote, SchedulingResult, TransitionStatus
from corral.domain.retry.policy import RetryPolicy, effective_policy
from corral.domain.session import ArrayPlace, NewSession
from corral.domain.slots import ResourceSlots
from corral.domain.spec import SessionSpec, SessionType
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import Clock, SessionId, UserId, new_session_id, utcnow
from corral.infra.events import EventBus, publish_appended
from corral.infra.hints import HintBus
from corral.store._direct import DirectStatement
from corral.store._sql import in_param, payload
from corral.store.admission import activate
from corral.store.database import Database
from corral.store.events import append_events, append_session_moves
from corral.store.group_options import forget_group_options, group_options_naming
from corral.store.retries import stop_chains
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
_AGENT_SPEC_FIELDS = {
    "image",
    "command",
    "env",
    "resources",
    "type",
    "workdir",
    "upload",
    "restart_limit",
}


def _agent_spec(spec: SessionSpec) -> dict[str, Any]:
    """The spec's fields its agents read, as stored; a restart limit only when set (0 is the
    default, and most sessions' rows stay as they were)."""
    stored = spec.model_dump(mode="json", include=_AGENT_SPEC_FIELDS, exclude_none=True)
    if not stored.get("restart_limit"):
        stored.pop("restart_limit", None)
    return stored


# Run for every submission: built once, run directly (`store._direct`).
_OWNER = sa.bindparam("owner", type_=sessions.c.owner_id.type)
_BY_CREATION_IDS = DirectStatement(
    lambda dialect: sa.select(
        sessions.c.creation_id, sessions.c.id, sa.cast(sessions.c.creation_fingerprint, sa.Text)
    ).where(
        sessions.c.owner_id == _OWNER,
        in_param(dialect, sessions.c.creation_id, "creation_ids"),
    )
)
_OWN_SESSIONS = DirectStatement(
    lambda dialect: sa.select(sessions.c.id).where(
        in_param(dialect, sessions.c.id, "ids"), sessions.c.owner_id == _OWNER
    )
)


# The elements of the owner's job arrays (by the arrays' ids) that a spec depends on whole.
_OWN_ARRAY_ELEMENTS = DirectStatement(
    lambda dialect: sa.select(sessions.c.array_id, sessions.c.id).where(
        in_param(dialect, sessions.c.array_id, "ids"), sessions.c.owner_id == _OWNER
    )
)


class SubmissionError(ValueError):
    """A request the controller refuses; `field` names what was wrong (for problem details)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class CreationIdConflictError(SubmissionError):
    """The owner used this `creation_id` for a different request: `fields` differ (HTTP 409)."""

    def __init__(self, creation_id: str, session_id: SessionId, fields: Sequence[str]) -> None:
        super().__init__(
            KEY_FIELD,
            f"creation_id {creation_id!r} was used for session {session_id} with a different "
            f"request ({', '.join(fields)} differ); a retry must send the same request, and "
            "a new request needs a new creation_id",
        )
        self.creation_id = creation_id
        self.session_id = session_id
        self.fields = tuple(fields)


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
    """The elements of a job array, in index order; `array_id` is its first element's id and
    `number` its first element's number, what users type (`domain.refs`)."""

    array_id: SessionId
    number: int
    indexes: tuple[int, ...]
    elements: tuple[Submitted, ...]
    throttle: int | None

    @property
    def created(self) -> bool:
        """Whether this submission created any element (False: all were created before)."""
        return any(e.created for e in self.elements)


@record
class ArrayRequest:
    """The array `enqueue_many`'s specs form: element i has index `indexes[i]`; `fingerprint`
    is the whole array request's, which each element keeps (`domain.idempotency`)."""

    indexes: tuple[int, ...]
    throttle: int | None
    fingerprint: Mapping[str, str] = field(default_factory=dict)


@record
class _Keyed:
    """A session already made under a creation_id, and the request it was made for."""

    session_id: SessionId
    fingerprint: Mapping[str, str] | None  # None: made before fingerprints were kept


@dataclass(slots=True)
class TerminateOutcome:
    """What a terminate request did with each session it named."""

    cancelled: list[SessionId] = field(default_factory=list)  # were PENDING: CANCELLED now
    terminating: list[SessionId] = field(default_factory=list)  # TERMINATING now
    unchanged: list[SessionId] = field(default_factory=list)  # already ending or ended: a no-op
    # Other attempts of the named sessions' retry chains, which the request stopped too: the
    # chains retry no more, and their live attempts were cancelled or are terminating.
    chain: list[SessionId] = field(default_factory=list)
    chain_stopped: bool = False  # a named session was part of a retry chain


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
        max_kernel_slots: ResourceSlots | None = None,
        retry_default: RetryPolicy | None = None,
    ) -> None:
        self.db = db
        self.max_array_size = max_array_size
        # The most of each slot one kernel may ask for (the `max_kernel_slots` setting).
        self.max_kernel_slots = max_kernel_slots
        # The cluster's layer of every session's retry policy (`domain.retry.policy`).
        self.retry_default = retry_default or RetryPolicy()
        self.hints = hints
        self.events = events
        self.clock = clock
        # Sessions a reader of the API cannot handle are failed through it (issue 33).
        self.quarantine = Quarantine(db, hints, events, clock=clock)
        # Where the bus can, events go out with the commit that appends them (not published).
        self._notify = events.commit_channel if events is not None else None
        # Submissions arriving together (API requests) share one transaction.
        self._submissions: GroupCommit[tuple[SessionSpec, UserId], Submitted] = GroupCommit(
            self._enqueue_together
        )

    async def activate(self, session_id: SessionId) -> bool:
        """Put a deactivated session (spec document 2) back in the queue with a fresh requeue
        count; False when it was not deactivated (nothing changed)."""
        now = self.clock()
        async with self.db.transaction() as conn:
            found = await activate(conn, session_id)
            if found is None or not found[1]:
                return False
            event = Event(
                kind=SESSION_ACTIVATED,
                entity_type=SESSION_ENTITY,
                entity_id=str(session_id),
                owner_id=found[2],
                payload={"requeue_count": 0},
                created_at=now,
            )
            events = await append_events(conn, [event], now, notify=self._notify)
        await self.hints.set_after_commit(Hint.SCHEDULE)
        await publish_appended(self.events, events)
        return True

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
            array=ArrayRequest(indexes, parsed.throttle, request_fingerprint(spec)),
        )
        first = elements[0]
        written = first.written
        if written is None:  # created before (the same creation_id)
            async with self.db.read() as conn:
                written = {
                    "array_number": await conn.scalar(
                        sa.select(sessions.c.array_number).where(sessions.c.id == first.session_id)
                    )
                }
        return SubmittedArray(
            first.session_id,
            int(written["array_number"]),
            indexes,
            tuple(elements),
            parsed.throttle,
        )

    async def enqueue_many(
        self,
        specs: Sequence[SessionSpec],
        owner: UserId,
        *,
        array: ArrayRequest | None = None,
    ) -> list[Submitted]:
        """Submit several sessions in one transaction (all or none); one result per spec.

        A `creation_id` the owner used before (or earlier in the same batch) for the same
        request returns that session instead of creating one; for a different request it is
        refused (CreationIdConflictError naming the fields that differ). With `array`, the
        specs are its elements in order.
        """
        for spec in specs:
            self._check_kernel_slots(spec)
        for attempt in range(2):  # a second pass only after a unique or foreign key refused
            created = await self._by_creation_ids(
                owner, {s.creation_id for s in specs if s.creation_id is not None}
            )
            results: list[Submitted | NewSession] = []  # the new ones until they are written
            asked: dict[SessionId, RetryPolicy | None] = {}  # each new one's own retry policy
            new: list[NewSession] = []
            array_id: SessionId | None = None  # the first element's, created now or before
            for position, spec in enumerate(specs):
                fingerprint = _fingerprint(spec, array)
                keyed = created.get(spec.creation_id) if spec.creation_id is not None else None
                if keyed is not None:
                    _check_same_request(spec, keyed, fingerprint)
                    results.append(Submitted(keyed.session_id, created=False))
                    array_id = array_id or keyed.session_id
                    continue
                session_id = new_session_id()
                place = None
                if array is not None:
                    array_id = array_id or session_id
                    place = ArrayPlace(array_id, array.indexes[position], array.throttle)
                session = _new_session(spec, owner, session_id, place, fingerprint)
                asked[session.id] = spec.retry_policy
                if spec.creation_id is not None:
                    created[spec.creation_id] = _Keyed(session.id, fingerprint)
                new.append(session)
                results.append(session)
            if not new:
                return [r for r in results if isinstance(r, Submitted)]
            now = self.clock()
            try:
                async with self.db.transaction() as conn:
                    options, members = await self._check_references(conn, specs, owner)
                    new = [
                        _with_elements(
                            _retrying(
                                _time_limited(n, options[n.resource_group]),
                                self.retry_default,
                                options[n.resource_group].retry_policy,
                                asked[n.id],
                            ),
                            members,
                        )
                        for n in new
                    ]
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
            await publish_appended(self.events, events)
            written = {row["id"]: row for row in rows}
            return [
                r if isinstance(r, Submitted) else Submitted(r.id, True, written[r.id])
                for r in results
            ]
        raise AssertionError("unreachable: the second pass returns or raises")

    async def mark_terminate(
        self, session_ids: Collection[SessionId], reason: str
    ) -> TerminateOutcome:
        """PENDING sessions become CANCELLED, started ones TERMINATING; ended ones are a no-op.

        A session in a retry chain stops its chain: no attempt of it is retried any more, and
        the chain's other live attempts (a retry waiting for its delay) end as well.
        """
        named = list(dict.fromkeys(session_ids))
        chain_stopped, chain = await stop_chains(self.db, named)
        ids = named + chain
        chained = dict.fromkeys(chain, f"{reason} (its retry chain was stopped)")
        note = {sid: ResultNote(USER_CANCELLED, chained.get(sid, reason)) for sid in ids}
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
            reasons = {sid: note[sid].message for sid in moves}
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
        outcome = TerminateOutcome(chain_stopped=chain_stopped)
        for sid in chain:
            if sid in applied.moved():
                outcome.chain.append(sid)
        for sid in named:
            after = applied.sessions.get(sid)
            if after is None:
                outcome.unchanged.append(sid)
            elif after[1] is SessionStatus.CANCELLED:
                outcome.cancelled.append(sid)
            else:
                outcome.terminating.append(sid)
        if outcome.terminating:
            await self.hints.set_after_commit(Hint.TERMINATE)
        await publish_appended(self.events, appended)
        return outcome

    def _check_kernel_slots(self, spec: SessionSpec) -> None:
        """Refuse a kernel asking more of a slot than the manager's `max_kernel_slots`."""
        most = self.max_kernel_slots
        if most is None:
            return
        for name, amount in spec.resources.items():
            if name in most and amount > most[name]:
                limit = ResourceSlots({name: most[name]}).format_human()
                raise SubmissionError(
                    f"resources.{name}",
                    f"{ResourceSlots({name: amount}).format_human()} is more than one kernel may "
                    f"ask for here ({limit}, the manager's max_kernel_slots); ask for less, or "
                    "spread the work over more kernels",
                )

    async def _by_creation_ids(
        self, owner: UserId, creation_ids: Collection[str]
    ) -> dict[str | None, _Keyed]:
        if not creation_ids:
            return {}
        params = {"owner": owner, "creation_ids": payload(self.db.dialect, list(creation_ids))}
        async with self.db.read_statements() as conn:
            rows = await _BY_CREATION_IDS.rows(conn, params)
        return {
            creation_id: _Keyed(SessionId(sid), None if kept is None else json.loads(kept))
            for creation_id, sid, kept in rows
        }

    async def _check_references(
        self, conn: AsyncConnection, specs: Sequence[SessionSpec], owner: UserId
    ) -> tuple[dict[str, ResourceGroupOptions], dict[uuid.UUID, list[uuid.UUID]]]:
        """Refuse unknown groups and dependencies and limits over a group's; the groups'
        options, and the elements of each job array a spec depends on as a whole."""
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
        wanted = {dep.session for spec in specs for dep in spec.dependencies if not dep.array}
        arrays = {dep.session for spec in specs for dep in spec.dependencies if dep.array}
        members: dict[uuid.UUID, list[uuid.UUID]] = {}
        if arrays:
            rows = await _OWN_ARRAY_ELEMENTS.rows(
                conn, {"ids": payload(dialect, arrays), "owner": owner}
            )
            for array_id, element in rows:
                members.setdefault(array_id, []).append(element)
            unknown = sorted(str(a) for a in arrays - members.keys())
            if unknown:
                raise SubmissionError(
                    "dependencies", f"no job array of yours has the id {', '.join(unknown)}"
                )
        if not wanted:
            return options, members
        found = set(
            await _OWN_SESSIONS.scalars(conn, {"ids": payload(dialect, wanted), "owner": owner})
        )
        missing = sorted(str(dep) for dep in wanted - found)
        if missing:
            raise SubmissionError(
                "dependencies", f"no session of yours has the id {', '.join(missing)}"
            )
        return options, members


def _with_elements(new: NewSession, members: Mapping[uuid.UUID, list[uuid.UUID]]) -> NewSession:
    """`new` waiting for each element of the arrays it depends on as a whole."""
    if not new.array_dependencies:
        return new
    kinds = dict(new.dependencies)  # a session named alone keeps the kind given to it
    for array_id, kind in new.array_dependencies:
        for element in members[array_id]:
            kinds.setdefault(element, kind)
    return dataclasses.replace(new, dependencies=tuple(kinds.items()), array_dependencies=())


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


def _fingerprint(spec: SessionSpec, array: ArrayRequest | None) -> dict[str, str] | None:
    """What a session made under `spec.creation_id` keeps of its request (None without one)."""
    if spec.creation_id is None:
        return None
    return dict(array.fingerprint) if array is not None else request_fingerprint(spec)


def _check_same_request(
    spec: SessionSpec, keyed: _Keyed, fingerprint: Mapping[str, str] | None
) -> None:
    """Refuse `spec` if the session made under its creation_id was made for another request."""
    if keyed.fingerprint is None or fingerprint is None:
        return
    differ = differing_fields(keyed.fingerprint, fingerprint)
    if differ:
        assert spec.creation_id is not None
        raise CreationIdConflictError(spec.creation_id, keyed.session_id, differ)


def _retrying(
    new: NewSession,
    cluster: RetryPolicy,
    group: RetryPolicy | None,
    asked: RetryPolicy | None,
) -> NewSession:
    """`new` with its effective retry policy: the cluster's, its group's, its own, merged.

    Only a BATCH session is retried automatically (spec document 5's decision log); a policy
    of no retries is not stored at all, so a session without one costs nothing more.
    """
    if new.type != SessionType.BATCH:
        return new
    key = (cluster, _layer_key(group), _layer_key(asked))
    max_retries, stored = _stored_policy(*key)
    if not max_retries:
        return new
    return dataclasses.replace(new, max_retries=max_retries, retry_policy=stored)


def _layer_key(
    layer: RetryPolicy | None,
) -> tuple[RetryPolicy, frozenset[str]] | None:
    """A policy layer as a cache key: equal layers merge alike only if they set the same fields."""
    return None if layer is None else (layer, frozenset(layer.model_fields_set))


@functools.lru_cache(maxsize=256)
def _stored_policy(
    cluster: RetryPolicy,
    group: tuple[RetryPolicy, frozenset[str]] | None,
    asked: tuple[RetryPolicy, frozenset[str]] | None,
) -> tuple[int, Mapping[str, Any]]:
    """The merged policy's retries and its stored form; a bulk submission shares a few policies
    among thousands of sessions (merging and dumping each cost a tenth of its time). The form
    is shared by them all: it is only ever written as JSON, never changed."""
    policy = effective_policy(cluster, *(layer and layer[0] for layer in (group, asked)))
    return policy.max_retries, policy.model_dump(mode="json")


def _new_session(
    spec: SessionSpec,
    owner: UserId,
    session_id: SessionId | None = None,
    array: ArrayPlace | None = None,
    fingerprint: Mapping[str, str] | None = None,
) -> NewSession:
    return NewSession(
        id=session_id or new_session_id(),
        owner_id=owner,
        type=spec.type.value,
        resource_group=spec.resource_group,
        cluster_mode=spec.cluster_mode.value,
        cluster_size=spec.cluster_size,
        spec=_agent_spec(spec),
        kernel_slots=spec.resources.to_milli(),
        name=spec.name,
        priority=spec.priority,
        creation_id=spec.creation_id,
        creation_fingerprint=fingerprint,
        starts_at=spec.starts_at,
        dependencies=tuple((d.session, d.kind) for d in spec.dependencies if not d.array),
        array_dependencies=tuple((d.session, d.kind) for d in spec.dependencies if d.array),
        time_limit_s=spec.time_limit_s,
        array=array,
    )


def _created_event(new: NewSession, number: int, now: datetime) -> Event:
    return Event(
        id=None,
        kind=SESSION_CREATED,
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
