"""`/v1/sessions`: submit, list, inspect, terminate, read logs, explain and remove sessions.

A user sees and acts on only their own sessions (another user's answers 404, as if it did not
exist); admins see all. Creation validates the whole spec (422 naming the field), is idempotent
on `creation_id`, and only marks: the coordinator does the rest.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response
from pydantic import BaseModel

from corral.api._pages import invalid_cursor
from corral.api.auth import CurrentUser, Db
from corral.api.problems import Problem, refused_submission
from corral.controller.sessions import SessionController, SubmissionError
from corral.domain.moments import parse_moment
from corral.domain.outcome import SessionResult
from corral.domain.slots import ResourceSlots
from corral.domain.spec import SessionSpec
from corral.domain.status import SessionStatus
from corral.domain.types import SessionId, UserId, utcnow
from corral.scheduler.explain import SessionNotFoundError, explain, explain_many
from corral.store.session_refs import (
    AmbiguousSessionRefError,
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
    # A job array's element: the array's id (its first element's) and this element's index.
    array_id: uuid.UUID | None = None
    array_index: int | None = None
    # Wall-time limit in seconds (None: none); while RUNNING, when it will be stopped.
    time_limit_s: int | None = None
    deadline_at: datetime | None = None
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


_FROM_SPEC = {"image", "command", "resources", "kernels"}  # SessionOut's fields `_out` derives


def _out(row: dict[str, Any], *, with_kernels: bool = False) -> SessionOut:
    spec = row["spec"] or {}
    resources = ResourceSlots.from_json(spec.get("resources") or {})
    return SessionOut(
        **{k: row[k] for k in SessionOut.model_fields.keys() - _FROM_SPEC if k in row},
        image=str(spec.get("image", "")),
        command=list(spec.get("command") or []),
        resources=resources,
        kernels=[KernelOut(**k) for k in row["kernels"]] if with_kernels else None,
    )


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
    included), 409 when a name or id prefix fits several."""
    owner_id = None if user.is_admin else user.user_id
    try:
        # A full id (what the SDK and `corral run` use) is read with the session at once.
        session_id = full_session_id(ref) or await resolve_session_ref(db, ref, owner_id)
    except SessionRefNotFoundError as exc:
        raise Problem(404, "session-not-found", "No such session", str(exc)) from exc
    except AmbiguousSessionRefError as exc:
        raise Problem(
            409,
            "session-ambiguous",
            "The session reference is ambiguous",
            str(exc),
            candidates=[
                {"number": c.number, "id": str(c.id), "owner": c.owner} for c in exc.candidates
            ],
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
)
async def create_session(
    spec: SessionSpec, user: CurrentUser, db: Db, request: Request, response: Response
) -> SessionOut:
    """Submit a session (201); the same `creation_id` again returns the first one (200)."""
    try:
        submitted = await _controller(request).enqueue(spec, user.user_id)
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
    row |= dict(written) | {"owner": owner}
    row["kernels"] = [dict.fromkeys(KernelOut.model_fields, None) | k for k in written["kernels"]]
    return row


@router.get("", response_model=SessionPage)
async def list_sessions_route(
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
) -> SessionPage:
    """Sessions, newest first: your own, or (admins) everyone's or one owner's."""
    owner_id: UserId | None = user.user_id
    if user.is_admin:
        owner_id = None
        if owner is not None:
            found = await get_user_record(db, owner)
            if found is None:
                return SessionPage(items=[], next_cursor=None)
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
    items = [_out(r) for r in rows]
    if reasons:
        pending = [i.id for i in items if i.status == SessionStatus.PENDING.value]
        why = await explain_many(db, pending, utcnow())
        items = [
            i.model_copy(update={"reason": why[i.id].reason}) if i.id in why else i for i in items
        ]
    return SessionPage(items=items, next_cursor=next_cursor)


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


@router.get("/{session_id}", response_model=SessionOut)
async def get_session_route(session_id: SessionRef, user: CurrentUser, db: Db) -> SessionOut:
    """One session with its kernels."""
    return _out(await _visible(db, user, session_id), with_kernels=True)


@router.post("/{session_id}/terminate", response_model=TerminateOut)
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
    return TerminateOut(id=found_id, number=found["number"], outcome=said, status=after["status"])


@router.get("/{session_id}/history", response_model=HistoryOut)
async def history(session_id: SessionRef, user: CurrentUser, db: Db) -> HistoryOut:
    """The session's scheduling history: every phase, its result and attempts."""
    found = await _visible(db, user, session_id)
    return HistoryOut(
        items=[HistoryEntry(**row) for row in await session_history_rows(db, found["id"])]
    )


@router.get("/{session_id}/explain", response_model=ExplanationOut)
async def explain_route(session_id: SessionRef, user: CurrentUser, db: Db) -> ExplanationOut:
    """Why a pending session waits: its place in the queue and the scheduler's reason."""
    found = await _visible(db, user, session_id)
    try:
        result = await explain(db, found["id"], utcnow())
    except SessionNotFoundError as exc:
        raise Problem(404, "session-not-found", "No such session", str(exc)) from exc
    return ExplanationOut.model_validate(result.as_json() | {"number": found["number"]})


@router.delete("/{session_id}", status_code=204)
async def remove_session(session_id: SessionRef, user: CurrentUser, db: Db) -> Response:
    """Remove an ended session with its kernels, history, logs and outputs."""
    found = await _visible(db, user, session_id)
    try:
        await delete_session(db, SessionId(found["id"]))
    except SessionNotEndedError as exc:
        raise Problem(409, "session-not-ended", "Session has not ended", str(exc)) from exc
    return Response(status_code=204)
