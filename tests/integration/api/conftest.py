"""An API app over a fresh database (both backends), with an admin and two users."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from fastapi import FastAPI

from corral.api.app import ApiContext, create_app
from corral.controller.agents import AgentController, AgentTimings
from corral.store.database import Database
from corral.store.users import Principal, create_user, issue_token
from tests.integration.coordination._harness import Cluster, make_cluster
from tests.integration.store._factories import NOW

JOIN = "join-secret"


@dataclass
class Caller:
    """A user of the API and the headers that authenticate them."""

    user: Principal
    headers: dict[str, str]


@dataclass
class ApiWorld:
    """The HTTP client on the app, callers of each kind, and the cluster behind the app."""

    http: httpx.AsyncClient
    cluster: Cluster
    agents: AgentController
    admin: Caller
    alice: Caller
    bob: Caller
    app: FastAPI | None = None  # the app `http` talks to (its state, for a test to steer)


async def _caller(db: Database, name: str, role: str) -> Caller:
    user_id = await create_user(db, name, role, NOW)
    token = await issue_token(db, user_id, "test", NOW)
    return Caller(Principal(user_id, name, role), {"Authorization": f"Bearer {token.secret}"})


@pytest.fixture
async def world(db: Database) -> AsyncIterator[ApiWorld]:
    """The app with its long-poll server running; agents are the cluster's test agents."""
    cluster = await make_cluster(db, [{"cpu": 8000, "mem": 16 * 1024**3 * 1000}])
    agents = AgentController(
        db,
        cluster.hints,
        join_token=JOIN,
        timings=AgentTimings(heartbeat_timeout_s=30, assignment_wait_s=30, poll_recheck_s=60),
        clock=cluster.clock,
    )
    polls = asyncio.create_task(agents.polls.run())
    context = ApiContext(db=db, agents=agents, sessions=cluster.controller, events=cluster.events)
    app = create_app(context)
    transport = httpx.ASGITransport(app=app)
    callers = [
        await _caller(db, name, role)
        for name, role in (("root", "admin"), ("alice", "user"), ("bob", "user"))
    ]
    async with httpx.AsyncClient(transport=transport, base_url="http://manager") as http:
        admin, alice, bob = callers
        yield ApiWorld(http, cluster, agents, admin, alice, bob, app=app)
    polls.cancel()
    await asyncio.gather(polls, return_exceptions=True)
