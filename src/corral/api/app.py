"""The manager's FastAPI application: routers, problem-details errors, health."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import field

from fastapi import FastAPI

from corral import package_version
from corral.api import (
    agents,
    agents_admin,
    arrays,
    deployments,
    events,
    health,
    outputs,
    resource_groups,
    retries,
    session_logs,
    sessions,
    uploads,
    users,
)
from corral.api.metrics import metrics_router
from corral.api.problems import PROBLEM_RESPONSES, install_problem_handlers
from corral.api.request_guard import RequestGuard
from corral.controller.agents import AgentController
from corral.controller.deployments import DeploymentController
from corral.controller.sessions import SessionController
from corral.coordination.loop import DualLoop
from corral.coordination.metrics import CoordinatorMetrics
from corral.domain.bounds import DEFAULT_MAX_REQUEST_BYTES
from corral.domain.record import record
from corral.domain.tokens import DEFAULT_TOKEN_TTL_S
from corral.infra.events import EventBus
from corral.store.database import Database
from corral.web import install as install_web

# Routes whose bodies have a cap of their own: an upload's archive (`upload_max_bytes`), an
# agent's output files (the agent's `max_output_bytes`).
UNCAPPED_BODIES = (
    ("PUT", r"^/v1/uploads/[^/]+$"),
    ("POST", r"^/v1/agents/[^/]+/outputs$"),
)


@record
class ApiContext:
    """What the routes work with: the manager's store, controllers and buses."""

    db: Database
    agents: AgentController
    sessions: SessionController
    events: EventBus | None = None
    loops: Sequence[DualLoop] = field(default_factory=tuple)  # for metrics and readiness
    metrics: CoordinatorMetrics | None = None
    upload_max_bytes: int = uploads.DEFAULT_UPLOAD_MAX_BYTES  # the cap of one upload's archive
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES  # any other request body (413 past it)
    # How long a new user token lasts when its request names no expiry (None: for ever).
    token_ttl_s: float | None = DEFAULT_TOKEN_TTL_S
    deployments: DeploymentController | None = None  # None: one over `db` and the sessions' hints
    # Set as the manager begins to stop: the long-lived responses end (`api._closing`).
    closing: asyncio.Event = field(default_factory=asyncio.Event)


def create_app(context: ApiContext) -> FastAPI:
    """The API app over the manager's controllers (the caller runs their side tasks)."""
    app = FastAPI(title="corral", version=package_version(), docs_url=None, redoc_url=None)
    app.state.context = context
    app.state.db = context.db
    app.state.agents = context.agents
    app.state.sessions = context.sessions
    app.state.token_cache = {}
    app.state.upload_max_bytes = context.upload_max_bytes
    app.state.token_ttl_s = context.token_ttl_s
    serving = context.deployments
    if serving is None and context.sessions is not None:
        serving = DeploymentController(
            context.db, context.sessions.hints, context.events, clock=context.sessions.clock
        )
    app.state.deployments = serving  # None only for a document built without a manager
    install_problem_handlers(app)
    app.add_middleware(
        RequestGuard, max_body_bytes=context.max_request_bytes, uncapped=UNCAPPED_BODIES
    )
    app.include_router(health.router)
    app.include_router(metrics_router(context, context.metrics))
    for router in (
        agents.router,
        agents_admin.router,
        sessions.router,
        session_logs.router,
        arrays.router,
        outputs.router,
        uploads.router,
        resource_groups.router,
        retries.router,
        users.router,
        events.router,
        deployments.router,
        deployments.serving_router,
    ):
        app.include_router(router, responses=PROBLEM_RESPONSES)
    install_web(app)

    return app
