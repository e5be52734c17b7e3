"""`/v1/arrays`: submit a job array in one request and one transaction; show, terminate and
remove it whole.

An array is a set of sessions made from one spec, one per index of Slurm's `--array` syntax
(`domain.arrays`). Users name it by its number (its first element's session number, as Slurm's
array job id is its first task's), and an element as `12_7` (`domain.refs`); its id is its
first element's session id. Its elements are ordinary sessions (`GET /v1/sessions?array_id=…`
lists them, each can be acted on alone); the throttle after `%` caps how many of them hold
resources at once (the scheduler enforces it).
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request, Response
from pydantic import BaseModel

from corral.api.auth import CurrentUser, Db
from corral.api.problems import Problem, ambiguous_ref, creation_id_conflict, refused_submission
from corral.controller.sessions import (
    CreationIdConflictError,
    SessionController,
    SubmissionError,
)
from corral.domain.arrays import ArraySpec
from corral.domain.outcome import SessionResult
from corral.domain.refs import ARRAY_NOT_FOUND
from corral.domain.slots import ResourceSlots
from corral.domain.types import SessionId
from corral.store.session_refs import (
    AmbiguousSessionRefError,
    ArrayRefNotFoundError,
    ArrayTarget,
    resolve_array_ref,
)
from corral.store.session_views import (
    SessionNotEndedError,
    array_elements,
    delete_sessions,
    get_session,
)
from corral.store.users import Principal

router = APIRouter(prefix="/v1/arrays", tags=["arrays"])

ArrayRef = Annotated[
    str,
    Path(
        description="The array's number (its first element's session number), its name, or "
        "its id (its first element's session id)"
    ),
]


class ArrayElementOut(BaseModel):
    """One element of a job array: its index and its session."""

    index: int
    session_id: uuid.UUID


class ArrayOut(BaseModel):
    """A job array as submitted: its number (what users type: `12`, its elements `12_7`), its
    id (its first element's session id) and its elements."""

    id: uuid.UUID
    number: int
    count: int
    throttle: int | None
    elements: list[ArrayElementOut]  # in index order


class ArrayElementState(BaseModel):
    """Where one element of a job array stands."""

    index: int
    session_id: uuid.UUID
    number: int
    status: str
    result: SessionResult | None
    exit_code: int | None
    started_at: datetime | None
    terminated_at: datetime | None


class ArrayView(BaseModel):
    """A job array as a whole: what it runs, how many elements are in each state, and each
    element (like Slurm's `scontrol show job` of an array)."""

    id: uuid.UUID
    number: int
    name: str | None
    owner: str
    count: int  # elements there now (removed ones are gone)
    throttle: int | None
    resource_group: str
    image: str
    command: list[str]
    resources: ResourceSlots  # per kernel of each element
    created_at: datetime
    statuses: dict[str, int]  # elements per status
    results: dict[str, int]  # ended elements per result
    elements: list[ArrayElementState]  # in index order


class ArrayTerminateOut(BaseModel):
    """What terminating an array did: how many elements were cancelled, are stopping, or had
    ended already."""

    id: uuid.UUID
    number: int
    outcome: Literal["cancelled", "terminating", "unchanged"]
    cancelled: int
    terminating: int
    unchanged: int


class ArrayRemoveOut(BaseModel):
    """What removing an array did."""

    id: uuid.UUID
    number: int
    removed: int  # elements removed


def _controller(request: Request) -> SessionController:
    sessions: SessionController = request.app.state.sessions
    return sessions


async def _visible_array(db: Any, user: Principal, ref: str) -> ArrayTarget:
    """The array `ref` names among those the caller can see: 404 otherwise, 409 when a name
    fits several."""
    owner_id = None if user.is_admin else user.user_id
    try:
        return await resolve_array_ref(db, ref, owner_id)
    except ArrayRefNotFoundError as exc:
        raise Problem(404, ARRAY_NOT_FOUND, "No such array", str(exc)) from exc
    except AmbiguousSessionRefError as exc:
        raise ambiguous_ref(exc, "array") from exc


@router.post(
    "",
    status_code=201,
    response_model=ArrayOut,
    responses={
        200: {"model": ArrayOut, "description": "Created before: the array of this `creation_id`"}
    },
    operation_id="create_array",
)
async def create_array(
    spec: ArraySpec, user: CurrentUser, request: Request, response: Response
) -> ArrayOut:
    """Submit a job array: every element or none (201); the same `creation_id` with the same
    request again, the same array (200); with a different request, 409 naming what differs."""
    try:
        submitted = await _controller(request).enqueue_array(spec, user.user_id)
    except CreationIdConflictError as exc:
        raise creation_id_conflict(exc.message, exc.fields, str(exc.session_id)) from exc
    except SubmissionError as exc:
        raise refused_submission(exc) from exc
    if not submitted.created:
        response.status_code = 200
    return ArrayOut(
        id=submitted.array_id,
        number=submitted.number,
        count=len(submitted.elements),
        throttle=submitted.throttle,
        elements=[
            ArrayElementOut(index=index, session_id=element.session_id)
            for index, element in zip(submitted.indexes, submitted.elements, strict=True)
        ],
    )


@router.get("/{array}", response_model=ArrayView, operation_id="get_array")
async def get_array(array: ArrayRef, user: CurrentUser, db: Db) -> ArrayView:
    """The array as a whole: its spec, its elements per state, and every element."""
    target = await _visible_array(db, user, array)
    elements = await array_elements(db, target.id)
    first = await get_session(db, elements[0]["id"]) if elements else None
    if first is None:
        raise Problem(404, ARRAY_NOT_FOUND, "No such array", f"job array {array!r} is gone")
    spec = first["spec"] or {}
    return ArrayView(
        id=target.id,
        number=target.number,
        name=first["name"],
        owner=first["owner"],
        count=len(elements),
        throttle=first["array_throttle"],
        resource_group=first["resource_group"],
        image=str(spec.get("image", "")),
        command=list(spec.get("command") or []),
        resources=ResourceSlots.from_json(spec.get("resources") or {}),
        created_at=first["created_at"],
        statuses=dict(Counter(e["status"] for e in elements)),
        results=dict(Counter(e["result"] for e in elements if e["result"] is not None)),
        elements=[ArrayElementState(**e, session_id=e["id"]) for e in elements],
    )


@router.post("/{array}/terminate", response_model=ArrayTerminateOut, operation_id="terminate_array")
async def terminate_array(
    array: ArrayRef, user: CurrentUser, db: Db, request: Request
) -> ArrayTerminateOut:
    """Cancel the array's pending elements and stop its started ones; ended ones stay."""
    target = await _visible_array(db, user, array)
    elements = await array_elements(db, target.id)
    outcome = await _controller(request).mark_terminate(
        [SessionId(e["id"]) for e in elements], "user request"
    )
    said: Literal["cancelled", "terminating", "unchanged"] = (
        "terminating" if outcome.terminating else "cancelled" if outcome.cancelled else "unchanged"
    )
    return ArrayTerminateOut(
        id=target.id,
        number=target.number,
        outcome=said,
        cancelled=len(outcome.cancelled),
        terminating=len(outcome.terminating),
        unchanged=len(outcome.unchanged),
    )


@router.delete("/{array}", response_model=ArrayRemoveOut, operation_id="delete_array")
async def remove_array(array: ArrayRef, user: CurrentUser, db: Db) -> ArrayRemoveOut:
    """Remove every element of an ended array, with their logs and history: all or none (409
    while an element has not ended)."""
    target = await _visible_array(db, user, array)
    elements = await array_elements(db, target.id)
    try:
        removed = await delete_sessions(
            db, [SessionId(e["id"]) for e in elements], what=f"job array {target.number}"
        )
    except SessionNotEndedError as exc:
        raise Problem(409, "session-not-ended", "Array has not ended", str(exc)) from exc
    return ArrayRemoveOut(id=target.id, number=target.number, removed=removed)
