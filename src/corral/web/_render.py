"""Rendering the dashboard's pages: one autoescaping Jinja environment, the navigation, and the
headers every page carries."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, PackageLoader, select_autoescape

from corral import package_version
from corral.domain.status import SESSION_TERMINAL, SessionStatus
from corral.domain.types import utcnow
from corral.store.users import Principal
from corral.web.auth import COOKIE_PATH, CSRF_FIELD

# The navigation: (path under /ui, label). A page another part adds appends its entry here and
# includes its router in `corral.web.install`.
NAV: list[tuple[str, str]] = [
    ("", "Overview"),
    ("/queue", "Queue"),
    ("/sessions", "Sessions"),
    ("/deployments", "Deployments"),
    ("/agents", "Agents"),
    ("/events", "Events"),
]

# A page may be framed by no one (its buttons cannot be clicked through another site's page),
# runs only its own script, and sends no address of its own to another site.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # no-referrer would make a form's Origin "null"
    "Cache-Control": "no-store",
}


# How many dashboards this manager streams to: each page's script waits, between refreshes,
# 20 times its fetch's duration times this, so all of them together take about 5 % of the
# manager's time however many are open.
DASHBOARDS_HEADER = "X-Corral-Dashboards"


def age(moment: datetime | None, now: datetime | None = None) -> str:
    """How long ago, briefly: `42s`, `3m 5s`, `2h 10m`, `3d 4h`; `-` for none."""
    if moment is None:
        return "-"
    seconds = max(0, int(((now or utcnow()) - moment).total_seconds()))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m {seconds}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def clock(moment: datetime | None) -> str:
    """A time as the pages show it (UTC, to the second)."""
    return "-" if moment is None else moment.strftime("%Y-%m-%d %H:%M:%S")


_env = Environment(
    loader=PackageLoader("corral.web", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.filters["age"] = age
_env.filters["clock"] = clock
_env.globals.update(
    ROOT=COOKIE_PATH,
    NAV=NAV,
    CSRF_FIELD=CSRF_FIELD,
    STATUSES=[s.value for s in SessionStatus],
    TERMINAL={s.value for s in SESSION_TERMINAL},
    VERSION=package_version(),
)


def page(
    request: Request,
    template: str,
    user: Principal | None,
    *,
    status_code: int = 200,
    **values: Any,
) -> HTMLResponse:
    """A page rendered for `user` (None: signed out), with the security headers."""
    body = _env.get_template(template).render(
        request=request,
        user=user,
        here=request.url.path,
        csrf_token=getattr(request.state, "csrf_token", ""),
        events_since=getattr(request.state, "events_since", 0),
        **values,
    )
    open_now = str(getattr(request.app.state, "dashboards_open", 0))
    headers = SECURITY_HEADERS | {DASHBOARDS_HEADER: open_now}
    return HTMLResponse(body, status_code=status_code, headers=headers)
