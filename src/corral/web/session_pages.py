"""The dashboard's session pages: the filterable table, one session (kernels, timeline,
explanation, log tail) and its terminate button.

A session is found through the API's own `_visible`: another user's session is "no such
session" to a plain user, by the table and by its URL alike.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response

from corral.api import session_logs, sessions
from corral.api.auth import Db
from corral.api.problems import Problem
from corral.domain.status import SessionStatus
from corral.domain.types import SessionId, UserId
from corral.scheduler.explain import explain
from corral.store.retries import Attempt, read_chain
from corral.store.session_views import (
    BadCursorError,
    SessionFilter,
    list_sessions,
    session_history_rows,
)
from corral.store.user_directory import get_user_record
from corral.web._render import page
from corral.web.auth import COOKIE_PATH, ActionUser, PageUser, StreamUser, form_fields, now_of
from corral.web.shared import acted

router = APIRouter(prefix=f"{COOKIE_PATH}/sessions", include_in_schema=False)

PAGE_SIZE = 50
LOG_TAIL_LINES = 200


@router.get("")
async def session_table(
    request: Request,
    user: PageUser,
    db: Db,
    status: Annotated[str, Query(max_length=32)] = "",
    owner: Annotated[str, Query(max_length=64)] = "",
    group: Annotated[str, Query(max_length=64)] = "",
    name: Annotated[str, Query(max_length=128)] = "",
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    """Sessions, newest first, filtered by status, owner (admins), group and name prefix."""
    filters = {"status": status, "owner": owner, "group": group, "name": name}
    if status and status not in SessionStatus.__members__:
        return _refused(request, user, "status", f"no status {status!r}", filters)
    owner_id: UserId | None = None if user.is_admin else user.user_id
    if owner and user.is_admin:
        found = await get_user_record(db, owner)
        owner_id = found.id if found is not None else UserId(uuid.UUID(int=0))
    where = SessionFilter(
        owner_id=owner_id,
        statuses=(status,) if status else (),
        resource_group=group or None,
        name_prefix=name or None,
    )
    try:
        rows, next_cursor = await list_sessions(db, where, limit=PAGE_SIZE, cursor=cursor)
    except BadCursorError:
        return _refused(request, user, "cursor", "not a cursor of this table", filters)
    return page(
        request,
        "sessions.html",
        user,
        rows=rows,
        filters=filters,
        next_cursor=next_cursor,
        paged=cursor is not None,
        now=now_of(request),
    )


def _refused(
    request: Request, user: Any, field: str, message: str, filters: dict[str, str]
) -> Response:
    return page(
        request,
        "sessions.html",
        user,
        status_code=422,
        rows=[],
        filters=filters,
        next_cursor=None,
        paged=False,
        now=now_of(request),
        error=f"{field}: {message}",
    )


@router.get("/{ref}")
async def session_page(
    request: Request,
    ref: str,
    user: PageUser,
    db: Db,
    stream: Literal["stdout", "stderr"] = "stdout",
    kernel: Annotated[int, Query(ge=0)] = 0,
) -> Response:
    """One session: its kernels, its timeline, why it waits, its log tail, terminate."""
    try:
        found = await sessions._visible(db, user, ref)
    except Problem as exc:
        return page(
            request, "error.html", user, status_code=exc.status, title=exc.title, detail=exc.detail
        )
    now = now_of(request)
    explanation = None
    if found["status"] == SessionStatus.PENDING.value:
        explanation = await explain(db, found["id"], now)
    chain: list[Attempt] = []
    retry_state = None
    if found["max_retries"] or found["retry_count"]:
        chain = await read_chain(db, SessionId(found["id"]))
        retry_state = await sessions._retry_state(db, found["id"], chain)
    return page(
        request,
        "session.html",
        user,
        s=found,
        live_entity=str(found["id"]),
        history=await session_history_rows(db, found["id"]),
        explanation=explanation,
        chain=chain,
        retry_state=retry_state,
        stream=stream,
        kernel=kernel,
        now=now,
    )


@router.post("/{ref}/terminate")
async def terminate(request: Request, ref: str, user: ActionUser, db: Db) -> Response:
    """Terminate the session (the API's own route), then back to its page."""
    ended = await sessions.terminate_session(ref, user, db, request)
    return acted(request, f"{COOKIE_PATH}/sessions/{ended.id}")


@router.post("/{ref}/activate")
async def activate(request: Request, ref: str, user: ActionUser, db: Db) -> Response:
    """Put a deactivated session back in the queue (the API's own route), then back to the
    queue or the session's page."""
    done = await sessions.activate_session(ref, user, db, request)
    back = (await form_fields(request)).get("back")
    where = "/queue" if back == "queue" else f"/sessions/{done.id}"
    return acted(request, f"{COOKIE_PATH}{where}")


@router.get("/{ref}/log")
async def log_tail(
    request: Request,
    ref: str,
    user: StreamUser,
    db: Db,
    stream: Literal["stdout", "stderr"] = "stdout",
    kernel: Annotated[int, Query(ge=0)] = 0,
) -> Response:
    """One kernel's last lines, then its output as it comes, until the session ends."""
    return await session_logs.session_logs(
        request,
        ref,
        user,
        db,
        stream=stream,
        kernel=kernel,
        offset=None,
        tail=LOG_TAIL_LINES,
        since=None,
        timestamps=False,
        follow=True,
    )
