"""The manager's FastAPI application: routers, problem-details errors, health."""

from __future__ import annotations

from fastapi import FastAPI

from corral import __version__
from corral.api import agents
from corral.api.problems import install_problem_handlers
from corral.controller.agents import AgentController


def create_app(agent_controller: AgentController) -> FastAPI:
    """The API app over the manager's controllers (the caller runs their side tasks)."""
    app = FastAPI(title="corral", version=__version__, docs_url=None, redoc_url=None)
    app.state.agents = agent_controller
    install_problem_handlers(app)
    app.include_router(agents.router)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict[str, str]:
        """The process answers."""
        return {"status": "ok"}

    return app
