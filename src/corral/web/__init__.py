"""The web dashboard at `/ui`, served by every manager: server-rendered pages that a small
script of our own (`static/corral.js`) refreshes when the event stream says something changed.

`install(app)` adds it to the API app. A page is a router included here and an entry in
`_render.NAV`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from importlib.resources import files
from typing import Annotated
from urllib.parse import urlsplit

from fastapi import APIRouter, FastAPI, Query, Request, Response
from fastapi.responses import RedirectResponse, StreamingResponse

from corral.api._closing import until_closing
from corral.api._pages import MAX_BIGINT
from corral.api.auth import Db
from corral.api.events import SSE_MEDIA_TYPE, _event_id, _quarantine, _unavailable
from corral.api.problems import Problem
from corral.infra.events import EventBusError
from corral.store.dashboard_sessions import close_dashboard_session, open_dashboard_session
from corral.web import deployment_pages, pages, session_pages
from corral.web._render import SECURITY_HEADERS, page
from corral.web.auth import (
    COOKIE,
    COOKIE_PATH,
    SESSION_LIFETIME,
    ActionUser,
    SignInRequired,
    StreamUser,
    cookie_secret,
    form_fields,
    now_of,
    principal_of,
    session_user,
    sign_in_url,
)
from corral.web.live import DashboardHub, DashboardStream
from corral.web.shared import SharedReads

router = APIRouter(prefix=COOKIE_PATH, include_in_schema=False)

_STATIC = files("corral.web").joinpath("static")
_STATIC_TYPES = {".js": "text/javascript", ".css": "text/css"}


def install(app: FastAPI) -> None:
    """Serve the dashboard at /ui from the API app."""
    app.add_exception_handler(SignInRequired, _to_sign_in)  # type: ignore[arg-type]
    app.state.dashboards_open = 0  # open page streams (`_render.DASHBOARDS_HEADER`)
    app.state.shared_reads = SharedReads()  # page data shared by dashboards (`web.shared`)
    app.state.dashboard_hub = None  # the open pages' one bus subscription, made with the first
    app.include_router(router)
    app.include_router(pages.router)
    app.include_router(session_pages.router)
    app.include_router(deployment_pages.router)


async def _to_sign_in(request: Request, exc: SignInRequired) -> Response:
    return RedirectResponse(sign_in_url(exc.next_path), status_code=303)


def _safe_next(next_path: str) -> str:
    """Where to go after signing in: only a page of the dashboard (no open redirect)."""
    if next_path.startswith(COOKIE_PATH) and not next_path.startswith("//"):
        return next_path
    return COOKIE_PATH


@router.get("/sign-in")
async def sign_in_form(request: Request, next: str = COOKIE_PATH) -> Response:
    """The sign-in page: a user token, as the API takes."""
    return page(request, "sign_in.html", None, next=_safe_next(next))


@router.post("/sign-in")
async def sign_in(request: Request, db: Db) -> Response:
    """Check the token; open a dashboard session bound to it, whose secret (not the token) an
    HttpOnly, SameSite=Strict cookie keeps; go to the dashboard."""
    origin = request.headers.get("origin")
    if origin is not None and urlsplit(origin).netloc != request.headers.get("host"):
        # Another site's form signing this browser in as someone else (login CSRF).
        raise Problem(
            403, "cross-site-sign-in", "Sign-in from another site", "sign in from the dashboard"
        )
    fields = await form_fields(request)
    token = fields.get("token", "").strip()
    next_path = _safe_next(fields.get("next", COOKIE_PATH))
    try:
        if not token:
            raise Problem(422, "validation-error", "No token", "token: paste a user token")
        await principal_of(request, token)
        opened = await open_dashboard_session(db, token, now_of(request), SESSION_LIFETIME)
        if opened is None:  # revoked or expired since the check
            raise Problem(401, "unauthenticated", "Unknown token", "the token is not valid")
    except Problem as exc:
        return page(
            request, "sign_in.html", None, status_code=exc.status, next=next_path, error=exc.detail
        )
    response = RedirectResponse(next_path, status_code=303)
    response.set_cookie(
        COOKIE,
        opened.secret,
        max_age=int(SESSION_LIFETIME.total_seconds()),
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/sign-out")
async def sign_out(request: Request, user: ActionUser, db: Db) -> Response:
    """End the dashboard session and forget the cookie (the token stays valid for the API)."""
    secret = cookie_secret(request)
    if secret is not None:
        await close_dashboard_session(db, secret)
    response = RedirectResponse(f"{COOKIE_PATH}/sign-in", status_code=303)
    response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
    return response


@router.get("/stream")
async def stream(
    request: Request,
    user: StreamUser,
    db: Db,
    since: Annotated[int | None, Query(ge=0, le=MAX_BIGINT)] = None,
    entity: Annotated[str | None, Query(max_length=64)] = None,
) -> Response:
    """The viewer's changes as Server-Sent Events, plain slim `message`s the page's script
    refreshes after, written in batches (`web.live`): one frame a batch for a page of many
    things, each event of its `entity` for a page of one; a reconnecting browser gets what it
    missed."""
    bus = request.app.state.context.events
    if bus is None:
        raise _unavailable("this manager runs without an event bus")
    try:
        async with bus.subscribe(maxsize=1):
            pass
    except EventBusError as exc:
        raise _unavailable(str(exc)) from exc
    last = request.headers.get("last-event-id")  # a reconnect: what it saw last
    start = since if last is None else _event_id(last)
    state = request.app.state
    if state.dashboard_hub is None or state.dashboard_hub.bus is not bus:
        state.dashboard_hub = DashboardHub(bus)
    secret = cookie_secret(request)

    async def allowed() -> bool:
        try:
            await session_user(request, secret or "")
        except Problem:
            return False
        return True

    events = DashboardStream(
        db,
        state.dashboard_hub,
        owner=None if user.is_admin else user.user_id,
        entity_id=entity,
        quarantine=_quarantine(request),
        allowed=allowed,
    )
    return StreamingResponse(
        until_closing(_counted(request, events.frames(start)), state.context.closing),
        media_type=SSE_MEDIA_TYPE,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _counted(request: Request, frames: AsyncGenerator[str, None]) -> AsyncIterator[str]:
    """The frames, counted among the open dashboards while they flow."""
    state = request.app.state
    state.dashboards_open += 1
    try:
        async with aclosing(frames):
            async for frame in frames:
                yield frame
    finally:
        state.dashboards_open -= 1


@router.get("/static/{name}")
async def static(name: str) -> Response:
    """The dashboard's own script and style sheet."""
    kind = _STATIC_TYPES.get(name[name.rfind(".") :] if "." in name else "")
    item = _STATIC.joinpath(name)
    if kind is None or "/" in name or not item.is_file():
        raise Problem(404, "not-found", "Not Found", f"no file {name!r} in the dashboard")
    headers = dict(SECURITY_HEADERS) | {"Cache-Control": "no-cache"}
    return Response(item.read_bytes(), media_type=kind, headers=headers)
