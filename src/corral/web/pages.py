"""The dashboard's cluster pages: overview, queue, agents (drain / undrain) and events."""

from __future__ import annotations

import bisect
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response

from corral.api import agents_admin
from corral.api.auth import Db
from corral.api.problems import Problem
from corral.store.events import read_events
from corral.web import queries
from corral.web._render import page
from corral.web.auth import COOKIE_PATH, ActionUser, PageUser, now_of
from corral.web.shared import acted, shared

router = APIRouter(prefix=COOKIE_PATH, include_in_schema=False)

NEWEST_EVENTS = 10  # on the overview
EVENTS_SHOWN = 100  # on the events page
AGENTS_SHOWN = 200  # on a page of the agents page


@router.get("")
async def overview(request: Request, user: PageUser, db: Db) -> Response:
    """Capacity per group, sessions by status, activity over the last hour, newest events."""
    owner = None if user.is_admin else user.user_id
    now = now_of(request)

    async def read() -> dict[str, Any]:
        minutes = await queries.activity(db, owner, now)
        return {
            "groups": await queries.capacity_by_group(db),
            "counts": await queries.count_by_status(db, owner),
            "minutes": minutes,
            "peak": max([1, *(max(m.started, m.ended) for m in minutes)]),
            "events": await read_events(db, limit=NEWEST_EVENTS, owner_id=owner, newest=True),
        }

    return page(request, "overview.html", user, **await shared(request, ("overview", owner), read))


@router.get("/queue")
async def queue(request: Request, user: PageUser, db: Db) -> Response:
    """Per group, the pending sessions in the scheduler's order, each with its reason."""
    now = now_of(request)
    owner = None if user.is_admin else user.user_id
    queues = await shared(request, ("queue", owner), lambda: queries.pending_queues(db, owner, now))
    return page(
        request,
        "queue.html",
        user,
        queues=queues,
        viewer=owner,
        now=now,
        limit=queries.MAX_QUEUE_SHOWN,
    )


@router.get("/agents")
async def agents(
    request: Request,
    user: PageUser,
    db: Db,
    after: Annotated[str, Query(max_length=256)] = "",
) -> Response:
    """The agents by id, `AGENTS_SHOWN` a page (after the agent `after`): status, heartbeat
    age, capacity and occupancy."""
    rows = await shared(request, ("agents",), lambda: queries.agent_rows(db))
    start = bisect.bisect_right([a.id for a in rows], after) if after else 0
    shown = rows[start : start + AGENTS_SHOWN]
    more = start + AGENTS_SHOWN < len(rows)
    return page(
        request,
        "agents.html",
        user,
        agents=shown,
        total=len(rows),
        first=start + 1,
        next_after=shown[-1].id if more else None,
        paged=bool(after),
        now=now_of(request),
    )


@router.post("/agents/{agent_id}/{action}")
async def agent_action(
    request: Request, agent_id: str, action: str, user: ActionUser, db: Db
) -> Response:
    """Drain or undrain an agent (admins), then back to the agents page."""
    if action not in ("drain", "undrain"):
        raise Problem(404, "not-found", "Not Found", f"no agent action {action!r}")
    if not user.is_admin:
        raise Problem(403, "forbidden", "Admins only", "only admins drain and undrain agents")
    if action == "drain":
        await agents_admin.agent_drain(agent_id, user, db, request)
    else:
        await agents_admin.agent_undrain(agent_id, user, db, request)
    return acted(request, f"{COOKIE_PATH}/agents")


@router.get("/events")
async def events(
    request: Request,
    user: PageUser,
    db: Db,
    kind: Annotated[str, Query(max_length=64)] = "",
    entity: Annotated[str, Query(max_length=64)] = "",
) -> Response:
    """The newest events, optionally of one kind (a prefix: `session.`) or entity."""
    owner = None if user.is_admin else user.user_id
    shown = await read_events(
        db,
        limit=EVENTS_SHOWN if not kind else 10 * EVENTS_SHOWN,
        owner_id=owner,
        entity_id=entity or None,
        newest=True,
    )
    if kind:
        shown = [e for e in shown if e.kind.startswith(kind)][-EVENTS_SHOWN:]
    return page(request, "events.html", user, events=shown[::-1], kind=kind, entity=entity)
