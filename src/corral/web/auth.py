"""Who is looking at the dashboard: a server-side dashboard session, its secret kept in an
HttpOnly, SameSite cookie.

Signing in checks the user's API token as the API does (`api.auth.current_user`), then opens a
dashboard session (`store.dashboard_sessions`) bound to that user and token: the cookie holds
only the session's random secret, which no script can read (HttpOnly) and no other site's
request carries (SameSite=Strict). Every request looks the session up in the database, so
signing out, revoking the token or removing the user ends it at once on every manager.
Every action (a POST) must also carry the CSRF token: an HMAC of the session's secret, the same
on every manager behind a load balancer, which a page of another site, unable to read the
cookie, cannot compute.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Annotated
from urllib.parse import parse_qs, quote

from fastapi import Depends, Request

from corral.api.auth import current_user
from corral.api.problems import Problem
from corral.store.dashboard_sessions import dashboard_session_user
from corral.store.users import Principal
from corral.web.queries import last_event_id

COOKIE = "corral_session"
CSRF_FIELD = "csrf_token"  # the hidden form field of every action
CSRF_HEADER = "x-csrf-token"  # or this header, for the page's script
COOKIE_PATH = "/ui"
_CSRF_CONTEXT = b"corral dashboard csrf v1"
# A dashboard session lasts this long (never beyond its token's expiry); then sign in again.
SESSION_LIFETIME = timedelta(hours=12)


class SignInRequired(Exception):
    """A page asked for without a valid cookie: the browser is sent to the sign-in page."""

    def __init__(self, next_path: str, why: str | None = None) -> None:
        super().__init__(why or "sign in")
        self.next_path = next_path
        self.why = why


def csrf_token(secret: str) -> str:
    """The CSRF token of a signed-in browser, derived from its dashboard session's secret."""
    return hmac.new(secret.encode(), _CSRF_CONTEXT, hashlib.sha256).hexdigest()


def now_of(request: Request) -> datetime:
    """The manager's clock (injected in tests), which sessions expire and pages age by."""
    clock: Callable[[], datetime] = request.app.state.context.agents.clock
    return clock()


def sign_in_url(next_path: str) -> str:
    """The sign-in page, coming back to `next_path` after."""
    return f"{COOKIE_PATH}/sign-in?next={quote(next_path, safe='/')}"


def cookie_secret(request: Request) -> str | None:
    """The dashboard session's secret the browser's cookie holds, if any."""
    secret = request.cookies.get(COOKIE, "").strip()
    return secret or None


async def principal_of(request: Request, token: str) -> Principal:
    """The user an API token belongs to, by the API's own rules (401 problems as the API's)."""
    return await current_user(request, token)


async def session_user(request: Request, secret: str) -> Principal:
    """The user of the dashboard session `secret`; 401 if it has ended."""
    user = await dashboard_session_user(request.app.state.db, secret, now_of(request))
    if user is None:
        raise Problem(
            401,
            "unauthenticated",
            "Authentication required",
            "sign in at /ui: this browser's dashboard session ended (signed out, expired, or "
            "its token was revoked)",
        )
    return user


async def page_user(request: Request) -> Principal:
    """The signed-in user of a page; otherwise the browser goes to the sign-in page."""
    secret = cookie_secret(request)
    here = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    if secret is None:
        raise SignInRequired(here)
    try:
        user = await session_user(request, secret)
    except Problem as exc:
        raise SignInRequired(here, exc.detail) from exc
    request.state.csrf_token = csrf_token(secret)
    # Read before the page's data: its stream starts here, and nothing in between is lost.
    request.state.events_since = await last_event_id(request.app.state.db)
    return user


async def stream_user(request: Request) -> Principal:
    """The signed-in user of a stream or a script's request: 401 without a valid cookie."""
    secret = cookie_secret(request)
    if secret is None:
        raise Problem(401, "unauthenticated", "Authentication required", "sign in at /ui")
    return await session_user(request, secret)


async def form_fields(request: Request) -> dict[str, str]:
    """An action's url-encoded form (the first value of each field); {} for another body."""
    kind = request.headers.get("content-type", "").split(";")[0].strip()
    if kind != "application/x-www-form-urlencoded":
        return {}
    fields = parse_qs((await request.body()).decode("utf-8", "replace"), max_num_fields=50)
    return {name: values[0] for name, values in fields.items()}


async def action_user(request: Request) -> Principal:
    """The signed-in user of an action (a POST): 403 unless it carries the CSRF token."""
    secret = cookie_secret(request)
    if secret is None:
        raise Problem(401, "unauthenticated", "Authentication required", "sign in at /ui")
    sent = (await form_fields(request)).get(CSRF_FIELD) or request.headers.get(CSRF_HEADER, "")
    if not hmac.compare_digest(sent.encode(), csrf_token(secret).encode()):
        raise Problem(
            403,
            "csrf-token-invalid",
            "Missing or wrong CSRF token",
            f"{CSRF_FIELD}: an action of the dashboard must carry the page's CSRF token; "
            "reload the page and try again",
            errors=[{"field": CSRF_FIELD, "message": "missing or wrong"}],
        )
    user = await session_user(request, secret)
    request.state.csrf_token = csrf_token(secret)
    return user


PageUser = Annotated[Principal, Depends(page_user)]
StreamUser = Annotated[Principal, Depends(stream_user)]
ActionUser = Annotated[Principal, Depends(action_user)]
