"""Agents as users see them (`GET /v1/agents`, `GET /v1/agents/{id}`); admins drain them and
remove those that left.

Apart from the agent protocol in `api/agents.py`, which shares the `/v1/agents` prefix but is
authenticated by agents' own tokens: these routes take users' bearer tokens.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Literal, cast

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, Field

from corral.api._pages import (
    Cursor,
    Limit,
    Page,
    decode_cursor,
    json_without_unencodable,
    page_of,
)
from corral.api.auth import AdminUser, CurrentUser, Db
from corral.api.problems import Problem
from corral.controller.sessions import SessionController
from corral.coordination.hints import Hint
from corral.domain.events import Event
from corral.domain.slots import ResourceSlots
from corral.domain.types import AgentId
from corral.store.agent_views import (
    AgentInUseError,
    AgentView,
    get_agent,
    list_agents,
    remove_agent,
    set_schedulable,
)

if TYPE_CHECKING:
    from corral.api.app import ApiContext

router = APIRouter(prefix="/v1/agents", tags=["agents"])
logger = logging.getLogger(__name__)

LISTING = "agents"
AgentStatus = Literal["ALIVE", "LOST", "TERMINATED"]


class AgentOut(BaseModel):
    """An agent: where it is, whether it takes work, what it offers and holds."""

    id: str
    address: str
    resource_group: str
    status: str = Field(description="ALIVE, LOST or TERMINATED")
    schedulable: bool = Field(description="false: drained, the scheduler places nothing here")
    runtime: str
    labels: dict[str, str]
    last_heartbeat_at: datetime | None
    status_changed_at: datetime
    created_at: datetime
    capacity: ResourceSlots = Field(description="slots offered")
    occupied: ResourceSlots = Field(description="slots held by its kernels ({} when idle)")
    kernels: int = Field(description="how many kernels on the agent have not ended")


class AgentPage(Page[AgentOut]):
    """A page of agents; `next_cursor` fetches the next one."""


@router.get("", response_model=AgentPage, operation_id="list_agents")
async def agents_list(
    request: Request,
    user: CurrentUser,
    db: Db,
    status: AgentStatus | None = None,
    resource_group: Annotated[str | None, Query(max_length=64)] = None,
    limit: Limit = 100,
    cursor: Cursor = None,
) -> Response:
    """Agents by id, optionally of one status or resource group."""
    rows = await list_agents(
        db,
        after_id=decode_cursor(LISTING, cursor, str),
        limit=limit + 1,
        status=status,
        resource_group=resource_group,
    )
    page = page_of(LISTING, rows, limit, lambda a: a.id)
    # An agent row no answer can carry (labels written before they were checked) is left out
    # and logged once: the others are listed (`coordination.quarantine`).
    quarantine = cast(SessionController, request.app.state.sessions).quarantine
    items: list[AgentOut] = []
    for agent in page.items:
        try:
            items.append(agent_out(agent))
        except (ValueError, TypeError) as exc:
            quarantine.skipped(LISTING, agent.id, exc)

    def listed(shown: list[AgentOut]) -> AgentPage:
        return AgentPage(items=shown, next_cursor=page.next_cursor)

    body, unencodable = json_without_unencodable(items, listed)
    for item in unencodable:
        quarantine.skipped(LISTING, item.id, "an agent that cannot be encoded")
    return Response(body, media_type="application/json")


@router.get("/{agent_id}", response_model=AgentOut, operation_id="get_agent")
async def agent_get(agent_id: str, user: CurrentUser, db: Db) -> AgentOut:
    """One agent; 404 if there is no such agent."""
    return agent_out(await _existing(db, agent_id))


@router.post("/{agent_id}/drain", response_model=AgentOut, operation_id="drain_agent")
async def agent_drain(agent_id: str, admin: AdminUser, db: Db, request: Request) -> AgentOut:
    """Place no new kernels on the agent (its kernels keep running); idempotent."""
    return await _set_schedulable(request, db, agent_id, False, admin.name)


@router.post("/{agent_id}/undrain", response_model=AgentOut, operation_id="undrain_agent")
async def agent_undrain(agent_id: str, admin: AdminUser, db: Db, request: Request) -> AgentOut:
    """Let the scheduler place kernels on the agent again; idempotent."""
    return await _set_schedulable(request, db, agent_id, True, admin.name)


@router.delete("/{agent_id}", status_code=204, operation_id="delete_agent")
async def agent_remove(agent_id: str, admin: AdminUser, db: Db, request: Request) -> Response:
    """Remove an agent that left (LOST or TERMINATED) and runs nothing; 409 otherwise."""
    context: ApiContext = request.app.state.context
    try:
        events = await remove_agent(db, AgentId(agent_id), context.agents.clock())
    except AgentInUseError as exc:
        raise Problem(409, "agent-in-use", "Agent in use", str(exc)) from exc
    if events is None:
        raise _not_found(agent_id)
    logger.info(events[0].kind, extra={"agent_id": agent_id, "by": admin.name})
    await _publish(context, events)
    return Response(status_code=204)


def agent_out(agent: AgentView) -> AgentOut:
    """The API shape of an agent."""
    return AgentOut(
        id=agent.id,
        address=agent.address,
        resource_group=agent.resource_group,
        status=agent.status,
        schedulable=agent.schedulable,
        runtime=agent.runtime,
        labels=agent.labels,
        last_heartbeat_at=agent.last_heartbeat_at,
        status_changed_at=agent.status_changed_at,
        created_at=agent.created_at,
        capacity=ResourceSlots.from_milli(agent.capacity),
        occupied=ResourceSlots.from_milli(agent.occupied),
        kernels=agent.kernel_count,
    )


async def _existing(db: Db, agent_id: str) -> AgentView:
    agent = await get_agent(db, AgentId(agent_id))
    if agent is None:
        raise _not_found(agent_id)
    return agent


async def _set_schedulable(
    request: Request, db: Db, agent_id: str, schedulable: bool, by: str
) -> AgentOut:
    context: ApiContext = request.app.state.context
    exists, events = await set_schedulable(
        db, AgentId(agent_id), schedulable, context.agents.clock()
    )
    if not exists:
        raise _not_found(agent_id)
    if events:
        logger.info(
            events[0].kind, extra={"agent_id": agent_id, "schedulable": schedulable, "by": by}
        )
        if schedulable:
            # Capacity came back: pending sessions may fit now.
            await context.agents.hints.set_after_commit(Hint.SCHEDULE.value)
        await _publish(context, events)
    return agent_out(await _existing(db, agent_id))


async def _publish(context: ApiContext, events: Sequence[Event]) -> None:
    if context.events is not None:
        await context.events.publish_after_commit(events)


def _not_found(agent_id: str) -> Problem:
    return Problem(
        404,
        "agent-not-found",
        "No such agent",
        f"agent {agent_id!r} is not registered; `corral agent ls` lists the agents",
    )
