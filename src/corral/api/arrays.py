"""`/v1/arrays`: submit a job array in one request and one transaction; terminate it whole.

An array is a set of sessions made from one spec, one per index of Slurm's `--array` syntax
(`domain.arrays`); its id is its first element's session id. Its elements are ordinary sessions
(`GET /v1/sessions?array_id=…` lists them, each can be acted on alone); the throttle after `%`
caps how many of them hold resources at once (the scheduler enforces it).
"""

from __future__ import annotations

import uuid
from typing import Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel

from corral.api.auth import CurrentUser, Db
from corral.api.problems import Problem, refused_submission
from corral.controller.sessions import SessionController, SubmissionError
from corral.domain.arrays import ArraySpec
from corral.domain.types import SessionId
from corral.store.session_views import array_elements

router = APIRouter(prefix="/v1/arrays", tags=["arrays"])


class ArrayElementOut(BaseModel):
    """One element of a job array: its index and its session."""

    index: int
    session_id: uuid.UUID


class ArrayOut(BaseModel):
    """A job array as submitted: its id (its first element's session id) and its elements."""

    id: uuid.UUID
    count: int
    throttle: int | None
    elements: list[ArrayElementOut]  # in index order


class ArrayTerminateOut(BaseModel):
    """What terminating an array did: how many elements were cancelled, are stopping, or had
    ended already."""

    id: uuid.UUID
    outcome: Literal["cancelled", "terminating", "unchanged"]
    cancelled: int
    terminating: int
    unchanged: int


def _controller(request: Request) -> SessionController:
    sessions: SessionController = request.app.state.sessions
    return sessions


@router.post(
    "",
    status_code=201,
    response_model=ArrayOut,
    responses={
        200: {"model": ArrayOut, "description": "Created before: the array of this `creation_id`"}
    },
)
async def create_array(
    spec: ArraySpec, user: CurrentUser, request: Request, response: Response
) -> ArrayOut:
    """Submit a job array: every element or none (201); the same `creation_id` again, the same
    array (200)."""
    try:
        submitted = await _controller(request).enqueue_array(spec, user.user_id)
    except SubmissionError as exc:
        raise refused_submission(exc) from exc
    if not submitted.created:
        response.status_code = 200
    return ArrayOut(
        id=submitted.array_id,
        count=len(submitted.elements),
        throttle=submitted.throttle,
        elements=[
            ArrayElementOut(index=index, session_id=element.session_id)
            for index, element in zip(submitted.indexes, submitted.elements, strict=True)
        ],
    )


@router.post("/{array_id}/terminate", response_model=ArrayTerminateOut)
async def terminate_array(
    array_id: uuid.UUID, user: CurrentUser, db: Db, request: Request
) -> ArrayTerminateOut:
    """Cancel the array's pending elements and stop its started ones; ended ones stay."""
    owner = None if user.is_admin else user.user_id
    elements = await array_elements(db, array_id, owner_id=owner)
    if not elements:
        raise Problem(404, "array-not-found", "No such array", f"no job array {array_id}")
    outcome = await _controller(request).mark_terminate(
        [SessionId(e) for e in elements], "user request"
    )
    said: Literal["cancelled", "terminating", "unchanged"] = (
        "terminating" if outcome.terminating else "cancelled" if outcome.cancelled else "unchanged"
    )
    return ArrayTerminateOut(
        id=array_id,
        outcome=said,
        cancelled=len(outcome.cancelled),
        terminating=len(outcome.terminating),
        unchanged=len(outcome.unchanged),
    )
