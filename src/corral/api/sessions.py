"""`/v1/sessions`: submit, list, inspect, terminate, read logs, explain and remove sessions.

A user sees and acts on only their own sessions (another user's answers 404, as if it did not
exist); admins see all. Creation validates the whole spec (422 naming the field), is idempotent
on `creation_id`, and only marks: the coordinator does the rest.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel

from corral.api._pages import (
    encoded_or_unencodable,
    invalid_cursor,
    json_without_unencodable,
    unencodable,
)
from corral.api.auth import CurrentUser, Db
from corral.api.problems import Problem, ambiguous_ref, creation_id_conflict, refused_submission
from corral.controller.sessions import (
    CreationIdConflictError,
    SessionController,
    SubmissionError,
)
from corral.domain.admission import KernelsReadyReason
from corral.domain.moments import parse_moment
from corral.domain.outcome import DependencyKind, SessionResult
from corral.domain.refs import REF_NAMES_ARRAY
from corral.domain.retry.decide import RetryDecision
from corral.domain.retry.policy import RetryPolicy
from corral.domain.retry.state import retry_state
from corral.domain.slots import ResourceSlots
from corral.domain.spec import SessionSpec
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import SessionId, UserId, utcnow
from corral.scheduler.explain import SessionNotFoundError, explain, explain_many
from corral.store.retries import Attempt, read_chain, read_retry_switch
from corral.store.session_refs import (
    AmbiguousSessionRefError,
    RefNamesArrayError,
    SessionRefNotFoundError,
    full_session_id,
    not_found_message,
    resolve_session_ref,
)
from corral.store.session_views import (
    BadCursorError,
    SessionFilter,
    SessionNotEndedError,
    delete_session,
    get_session,
    list_sessions,
    session_history_rows,
)
from corral.store.user_directory import get_user_record
from corral.store.users import Principal

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])


class KernelOut(BaseModel):
    """One kernel of a session."""

    id: uuid.UUID
    cluster_role: str
    cluster_index: int
    agent_id: str | None
    status: str
    status_info: str | None
    exit_code: int | None
    failure_cause: str | None
    runtime_info: dict[str, Any]
    status_changed_at: datetime
    # The restart policy (issue 36): how often its agents restarted it after a non-zero exit,
    # and whether a restart is under way (it is down, being started again).
    restarts: int = 0
    restarting: bool = False


class SessionOut(BaseModel):
    """A session as users see it."""

    id: uuid.UUID
    number: int  # short, cluster-wide, increasing: what users type
    name: str | None
    owner: str
    type: str
    status: str
    status_info: str | None
    status_changed_at: datetime
    created_at: datetime
    started_at: datetime | None
    terminated_at: datetime | None
    result: SessionResult | None
    failure_cause: str | None
    exit_code: int | None
    resource_group: str
    cluster_mode: str
    cluster_size: int
    priority: int
    image: str
    command: list[str]
    resources: ResourceSlots  # per kernel
    creation_id: str | None
    # A job array's element: the array's id (its first element's), its number (what users
    # type: `12`, the element being `12_7`), this element's index and the array's throttle.
    array_id: uuid.UUID | None = None
    array_number: int | None = None
    array_index: int | None = None
    array_throttle: int | None = None
    # Where its kernels start: the submitting directory, or its upload (a sha256 digest).
    workdir: str | None = None
    upload: str | None = None
    # For one session read alone: the sessions it waits for, and when it may start after each
    # (`--after`, Slurm's kinds; a whole array's elements each).
    dependencies: list[DependencyOut] | None = None
    # Wall-time limit in seconds (None: none); while RUNNING, when it will be stopped.
    time_limit_s: int | None = None
    deadline_at: datetime | None = None
    starts_at: datetime | None = None  # not placed before (a retry's: after its delay)
    # Retry (spec document 5): the chain this session is an attempt of (the parent it
    # retries, its place, the policy, the cause it retries) and, for one session read alone,
    # the chain's ids oldest first and where it stands in words.
    parent_session_id: uuid.UUID | None = None
    retry_count: int = 0
    max_retries: int = 0
    retry_policy: RetryPolicy | None = None
    retry_cause: str | None = None
    retry_decision: RetryDecision | None = None
    retry_chain: list[uuid.UUID] | None = None
    retry_state: str | None = None
    # All-or-nothing admission (spec document 2): the KernelsReady condition (None while not
    # admitted) with its reason and last transition; evictions for not becoming ready in time,
    # when it may be placed again, and whether it is in the queue at all (False: deactivated
    # after too many requeues; `POST /v1/sessions/{id}/activate` puts it back).
    kernels_ready: bool | None = None
    kernels_ready_reason: KernelsReadyReason | None = None
    kernels_ready_at: datetime | None = None
    requeue_count: int = 0
    requeue_at: datetime | None = None
    active: bool = True
    evicted_at: datetime | None = None
    eviction_reason: str | None = None
    deactivated_at: datetime | None = None
    # The restart policy (issue 36): how often each kernel may be restarted after a non-zero
    # exit, and, for one session read alone, how often its kernels were in all.
    restart_limit: int = 0
    restarts: int | None = None
    kernels: list[KernelOut] | None = None
    # Listings asked `reasons=true`: why a PENDING session waits, in a word (the code
    # `/explain` gives, else its outcome); None for the others.
    reason: str | None = None


class SessionPage(BaseModel):
    """A page of sessions, newest first."""

    items: list[SessionOut]
    next_cursor: str | None


class TerminateOut(BaseModel):
    """What a terminate request did."""

    id: uuid.UUID
    number: int
    outcome: Literal["cancelled", "terminating", "unchanged"]
    status: str
    # The session is an attempt of a retry chain, which the request stopped: no attempt of it
    # is retried any more; `chain_ended` are its other attempts the request ended too.
    retry_chain_stopped: bool = False
    chain_ended: list[uuid.UUID] = []
    message: str | None = None


class AttemptOut(BaseModel):
    """One attempt of a retry chain."""

    id: uuid.UUID
    number: int
    attempt: int  # 1 for the first
    status: str
    result: SessionResult | None
    failure_cause: str | None
    retry_cause: str | None  # the failure of the attempt before that this one retries
    exit_code: int | None
    created_at: datetime
    starts_at: datetime | None
    started_at: datetime | None
    terminated_at: datetime | None
    retry_decision: RetryDecision | None


class AttemptsOut(BaseModel):
    """The attempts of a session's retry chain, oldest first (the session alone without one)."""

    max_retries: int
    retry_state: str | None
    items: list[AttemptOut]


class HistoryEntry(BaseModel):
    """One row of a session's scheduling history."""

    phase: str
    from_status: str | None
    to_status: str | None
    result: str
    error_code: str | None
    message: str
    attempts: int
    created_at: datetime
    updated_at: datetime


class HistoryOut(BaseModel):
    """A session's scheduling history, oldest first."""

    items: list[HistoryEntry]


class ExplanationOut(BaseModel):
    """Where a session stands in its group's queue, and why it is (not) placed."""

    session_id: uuid.UUID
    number: int
    status: str
    resource_group: str
    position: int | None
    queue_length: int
    outcome: str
    code: str | None
    message: str


def _controller(request: Request) -> SessionController:
    sessions: SessionController = request.app.state.sessions
    return sessions


# SessionOut's fields `_out` derives
_FROM_SPEC = {
    "image",
    "command",
    "resources",
    "kernels",
    "workdir",
    "dependencies",
    "restart_limit",
    "restarts",
}


class DependencyOut(BaseModel):
    """A session this one waits for (a whole array's elements each), and the kind."""

    session: uuid.UUID
    kind: DependencyKind


# What makes a stored row unshowable (a spec that does not parse, slots out of bounds); text
# that cannot be encoded shows only when the answer is encoded (`json_without_unencodable`).
_UNSHOWABLE = (ValueError, TypeError, KeyError, AttributeError)
_LISTING = "listing sessions"


async def _shown(
    request: Request,
    db: Any,
    rows: list[dict[str, Any]],
    build: Callable[[list[SessionOut]], BaseModel],
    *,
    with_kernels: bool = False,
) -> str:
    """`build` over the rows as sessions, as JSON text. A row that cannot be shown has its
    session failed (`coordination.quarantine`) and is shown scrubbed: its spec left out and its
    text made encodable; one that cannot be shown even so is left out, and logged once."""
    quarantine = _controller(request).quarantine
    items: list[SessionOut] = []
    poisoned: dict[SessionId, str] = {}
    for row in rows:
        try:
            items.append(_out(row, with_kernels=with_kernels))
        except _UNSHOWABLE as exc:
            poisoned[SessionId(row["id"])] = f"the stored session cannot be shown: {exc}"
    if not poisoned:
        body, bad = encoded_or_unencodable(items, build)
        if body is not None:
            return body
    else:
        bad = unencodable(items)
    for item in bad:
        poisoned[SessionId(item.id)] = "the stored session holds text that cannot be encoded"
    await quarantine.isolate(poisoned, where=_LISTING)
    shown = [i for i in items if i.id not in poisoned]
    for sid in poisoned:
        found = await get_session(db, sid)
        try:
            scrubbed = _out(_scrubbed(found), with_kernels=with_kernels) if found else None
        except _UNSHOWABLE as exc:
            quarantine.skipped(_LISTING, sid, exc)
            continue
        if scrubbed is not None:
            shown.append(scrubbed)
    order = {str(row["id"]): index for index, row in enumerate(rows)}
    shown.sort(key=lambda item: order[str(item.id)])
    body, still = json_without_unencodable(shown, build)
    for item in still:
        quarantine.skipped(_LISTING, item.id, "text that cannot be encoded")
    return body


def _scrubbed(row: Mapping[str, Any]) -> dict[str, Any]:
    """A session's row without its spec, every text in it made encodable (a lone surrogate
    becomes '?'): what is shown of a session whose row cannot be shown as it is."""
    return {key: _scrub(value) for key, value in row.items() if key != "spec"} | {"spec": {}}


def _scrub(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, Mapping):
        return {_scrub(k): _scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_scrub(v) for v in value]
    return value


def _out(row: dict[str, Any], *, with_kernels: bool = False) -> SessionOut:
    spec = row["spec"] or {}
    resources = ResourceSlots.from_json(spec.get("resources") or {})
    return SessionOut(
        **{k: row[k] for k in SessionOut.model_fields.keys() - _FROM_SPEC if k in row},
        image=str(spec.get("image", "")),
        command=list(spec.get("command") or []),
        workdir=spec.get("workdir"),
        dependencies=[
            DependencyOut(session=d["depends_on"], kind=d["kind"])
            for d in row.get("dependencies") or ()
        ]
        if with_kernels
        else None,
        resources=resources,
        restart_limit=int(spec.get("restart_limit") or 0),
        restarts=sum(k["restarts"] for k in row["kernels"]) if with_kernels else None,
        kernels=[_kernel_out(k) for k in row["kernels"]] if with_kernels else None,
    )


def _kernel_out(kernel: Mapping[str, Any]) -> KernelOut:
    """A kernel as shown: restarting only while RUNNING (a kernel stopped or lost during a
    restart keeps the stored flag until its next report)."""
    restarting = bool(kernel["restarting"]) and kernel["status"] == KernelStatus.RUNNING.value
    return KernelOut(**{**kernel, "restarting": restarting})


# What every route taking a session accepts in its path (`store.session_refs`).
SessionRef = Annotated[
    str,
    Path(
        description="The session's id, its number, a unique prefix of its id, or its name "
        "(unique among the sessions you can see)"
    ),
]


async def _visible(db: Any, user: Principal, ref: str | uuid.UUID) -> dict[str, Any]:
    """The session `ref` names, if the caller may see it: 404 otherwise (another's session
    included), 409 when a name or id prefix fits several or it names a whole job array."""
    owner_id = None if user.is_admin else user.user_id
    try:
        # A full id (what the SDK and `corral run` use) is read with the session at once.
        session_id = full_session_id(ref) or await resolve_session_ref(db, ref, owner_id)
    except SessionRefNotFoundError as exc:
        raise Problem(404, "session-not-found", "No such session", str(exc)) from exc
    except AmbiguousSessionRefError as exc:
        raise ambiguous_ref(exc, "session") from exc
    except RefNamesArrayError as exc:
        raise Problem(
            409,
            REF_NAMES_ARRAY,
            "The reference names a job array, not one session",
            str(exc),
            array={"id": str(exc.array.id), "number": exc.array.number},
        ) from exc
    found = await get_session(db, session_id)
    if found is None or (owner_id is not None and found["owner_id"] != owner_id):
        raise Problem(404, "session-not-found", "No such session", not_found_message(ref))
    return found


@router.post(
    "",
    status_code=201,
    response_model=SessionOut,
    responses={
        200: {
            "model": SessionOut,
            "description": "Created before: the session of this `creation_id`",
        }
    },
    operation_id="create_session",
)
async def create_session(
    spec: SessionSpec, user: CurrentUser, db: Db, request: Request, response: Response
) -> SessionOut:
    """Submit a session (201); the same `creation_id` with the same request again returns the
    first one (200), with a different request is refused (409, naming the fields that differ)."""
    try:
        submitted = await _controller(request).enqueue(spec, user.user_id)
    except CreationIdConflictError as exc:
        raise creation_id_conflict(exc.message, exc.fields, str(exc.session_id)) from exc
    except SubmissionError as exc:
        raise refused_submission(exc) from exc
    if submitted.written is None:
        response.status_code = 200
        return _out(await _visible(db, user, submitted.session_id), with_kernels=True)
    # Answered from what was written: reading it back cost a fifth of a create's time.
    return _out(_as_shown(submitted.written, user.name), with_kernels=True)


def _as_shown(written: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """A session's row as written on submission, in the shape `get_session` reads it back."""
    row = dict.fromkeys(SessionOut.model_fields.keys() - _FROM_SPEC, None)
    row |= dict(written) | {"owner": owner, "active": written.get("requeue_active", True)}
    fresh = dict.fromkeys(KernelOut.model_fields, None) | {"restarts": 0, "restarting": False}
    row["kernels"] = [fresh | k for k in written["kernels"]]
    return row


@router.get("", response_model=SessionPage, operation_id="list_sessions")
async def list_sessions_route(
    request: Request,
    user: CurrentUser,
    db: Db,
    status: Annotated[list[SessionStatus] | None, Query()] = None,
    owner: Annotated[str | None, Query(description="admins: one owner's sessions")] = None,
    resource_group: str | None = None,
    type: str | None = None,
    array_id: Annotated[uuid.UUID | None, Query(description="one job array's elements")] = None,
    since: Annotated[
        str | None,
        Query(
            max_length=64,
            description="Only sessions created since: an age (2h) or an ISO 8601 time",
        ),
    ] = None,
    reasons: Annotated[
        bool, Query(description="Say why each PENDING session waits (`reason`)")
    ] = False,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    cursor: str | None = None,
) -> Response:
    """Sessions, newest first: your own, or (admins) everyone's or one owner's."""
    owner_id: UserId | None = user.user_id
    if user.is_admin:
        owner_id = None
        if owner is not None:
            found = await get_user_record(db, owner)
            if found is None:
                empty = SessionPage(items=[], next_cursor=None)
                return Response(empty.model_dump_json(), media_type="application/json")
            owner_id = found.id
    elif owner is not None and owner != user.name:
        raise Problem(403, "forbidden", "Admins only", "only admins list other users' sessions")
    where = SessionFilter(
        owner_id=owner_id,
        statuses=tuple(s.value for s in status or ()),
        resource_group=resource_group,
        type=type.upper() if type else None,
        array_id=array_id,
        since=None if since is None else _moment("since", since),
    )
    try:
        rows, next_cursor = await list_sessions(db, where, limit=limit, cursor=cursor)
    except BadCursorError as exc:
        raise invalid_cursor(cursor or "") from exc
    why: dict[uuid.UUID, Any] = {}
    if reasons:
        pending = [SessionId(r["id"]) for r in rows if r["status"] == SessionStatus.PENDING.value]
        why = dict(await explain_many(db, pending, utcnow()))

    def page(items: list[SessionOut]) -> SessionPage:
        return SessionPage(
            items=[
                i.model_copy(update={"reason": why[i.id].reason}) if i.id in why else i
                for i in items
            ],
            next_cursor=next_cursor,
        )

    body = await _shown(request, db, rows, page)
    return Response(body, media_type="application/json")


def _moment(field: str, value: str) -> datetime:
    """A query parameter's age (`2h`) or ISO 8601 time; 422 naming `field` if it is neither."""
    try:
        return parse_moment(value, utcnow())
    except ValueError as exc:
        raise Problem(
            422,
            "validation-error",
            "The request is not valid",
            f"{field}: {exc}",
            errors=[{"field": field, "message": str(exc)}],
        ) from None


@router.get("/{session_id}", response_model=SessionOut, operation_id="get_session")
async def get_session_route(
    request: Request, session_id: SessionRef, user: CurrentUser, db: Db
) -> Response:
    """One session with its kernels, and its retry chain if it has one."""
    found = await _visible(db, user, session_id)
    chained: dict[str, Any] = {}
    if found["max_retries"] or found["retry_count"]:
        chain = await read_chain(db, SessionId(found["id"]))
        chained = {
            "retry_chain": [a.link.id for a in chain],
            "retry_state": await _retry_state(db, found["id"], chain),
        }

    def one(items: list[SessionOut]) -> BaseModel:
        if not items:  # not even its scrubbed form could be shown
            raise Problem(
                500, "session-unshowable", "The session cannot be shown", "see the manager's log"
            )
        return items[0].model_copy(update=chained) if chained else items[0]

    body = await _shown(request, db, [found], one, with_kernels=True)
    return Response(body, media_type="application/json")


@router.get(
    "/{session_id}/attempts", response_model=AttemptsOut, operation_id="list_session_attempts"
)
async def attempts_route(session_id: SessionRef, user: CurrentUser, db: Db) -> AttemptsOut:
    """The attempts of the session's retry chain, oldest first, each with how it ended."""
    found = await _visible(db, user, session_id)
    chain = await read_chain(db, SessionId(found["id"]))
    return AttemptsOut(
        max_retries=found["max_retries"],
        retry_state=await _retry_state(db, found["id"], chain),
        items=[
            AttemptOut(
                id=a.link.id,
                number=a.link.number,
                attempt=a.link.retry_count + 1,
                status=a.link.status.value,
                result=a.link.result,
                failure_cause=a.link.failure_cause,
                retry_cause=a.retry_cause,
                exit_code=a.exit_code,
                created_at=a.created_at,
                starts_at=a.link.starts_at,
                started_at=a.started_at,
                terminated_at=a.terminated_at,
                retry_decision=a.link.retry_decision,
            )
            for a in chain
        ],
    )


async def _retry_state(db: Any, session_id: uuid.UUID, chain: list[Attempt]) -> str | None:
    """Where `session_id` stands in its chain, in words (`domain.retry.state`)."""
    links = [a.link for a in chain]
    at = next((i for i, link in enumerate(links) if link.id == session_id), None)
    if at is None:
        return None
    child = links[at + 1] if at + 1 < len(links) else None
    async with db.read() as conn:
        paused = (await read_retry_switch(conn)).paused
    return retry_state(links[at], child, paused=paused, now=utcnow())


@router.post(
    "/{session_id}/terminate", response_model=TerminateOut, operation_id="terminate_session"
)
async def terminate_session(
    session_id: SessionRef, user: CurrentUser, db: Db, request: Request
) -> TerminateOut:
    """Cancel a pending session, stop a started one; an ended one is left as it is."""
    found = await _visible(db, user, session_id)
    found_id = SessionId(found["id"])
    outcome = await _controller(request).mark_terminate([found_id], "user request")
    said: Literal["cancelled", "terminating", "unchanged"] = (
        "cancelled" if outcome.cancelled else "terminating" if outcome.terminating else "unchanged"
    )
    after = await _visible(db, user, found_id)
    message = None
    if outcome.chain_stopped:
        message = "its retry chain was stopped: no attempt of it is retried any more"
        if outcome.chain:
            message += f"; {len(outcome.chain)} other attempt(s) of the chain ended too"
    return TerminateOut(
        id=found_id,
        number=found["number"],
        outcome=said,
        status=after["status"],
        retry_chain_stopped=outcome.chain_stopped,
        chain_ended=list(outcome.chain),
        message=message,
    )


class ActivateOut(BaseModel):
    """What an activate request did: `activated`, or `unchanged` (it was not deactivated)."""

    id: uuid.UUID
    number: int
    outcome: Literal["activated", "unchanged"]
    status: str
    message: str | None = None


@router.post("/{session_id}/activate", response_model=ActivateOut, operation_id="activate_session")
async def activate_session(
    session_id: SessionRef, user: CurrentUser, db: Db, request: Request
) -> ActivateOut:
    """Put a session deactivated by all-or-nothing admission (too many requeues) back in the
    queue with a fresh requeue count; any other session is left as it is."""
    found = await _visible(db, user, session_id)
    found_id = SessionId(found["id"])
    done = await _controller(request).activate(found_id)
    message = None
    if not done:
        message = (
            "it is not deactivated: only a PENDING session that all-or-nothing admission "
            "deactivated can be activated"
        )
    return ActivateOut(
        id=found_id,
        number=found["number"],
        outcome="activated" if done else "unchanged",
        status=found["status"],
        message=message,
    )


@router.get("/{session_id}/history", response_model=HistoryOut, operation_id="get_session_history")
async def history(session_id: SessionRef, user: CurrentUser, db: Db) -> HistoryOut:
    """The session's scheduling history: every phase, its result and attempts."""
    found = await _visible(db, user, session_id)
    return HistoryOut(
        items=[HistoryEntry(**row) for row in await session_history_rows(db, found["id"])]
    )


@router.get("/{session_id}/explain", response_model=ExplanationOut, operation_id="explain_session")
async def explain_route(session_id: SessionRef, user: CurrentUser, db: Db) -> ExplanationOut:
    """Why a pending session waits: its place in the queue and the scheduler's reason."""
    found = await _visible(db, user, session_id)
    try:
        result = await explain(db, found["id"], utcnow())
    except SessionNotFoundError as exc:
        raise Problem(404, "session-not-found", "No such session", str(exc)) from exc
    return ExplanationOut.model_validate(result.as_json() | {"number": found["number"]})


@router.delete("/{session_id}", status_code=204, operation_id="delete_session")
async def remove_session(session_id: SessionRef, user: CurrentUser, db: Db) -> Response:
    """Remove an ended session with its kernels, history, logs and outputs."""
    found = await _visible(db, user, session_id)
    try:
        await delete_session(db, SessionId(found["id"]))
    except SessionNotEndedError as exc:
        raise Problem(409, "session-not-ended", "Session has not ended", str(exc)) from exc
    return Response(status_code=204)
