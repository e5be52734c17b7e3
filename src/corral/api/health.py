"""Probes: `/healthz` (the process answers) and `/readyz` (it can do its work).

Both are unauthenticated, like every orchestrator's probes: a load balancer or kubelet calls
them without a token. They say nothing a caller could use: a failed check names its kind of
error, never the message (which may carry hosts or SQL); the log event has the details. They
are infrastructure, not the user's API, so they stay out of the OpenAPI document (where a
fuzzer would also read a not-ready 503 as a server error).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Literal

import sqlalchemy as sa
from fastapi import APIRouter, Request
from pydantic import BaseModel

from corral.api.problems import Problem
from corral.store.database import Database

if TYPE_CHECKING:
    from corral.api.app import ApiContext  # app.py includes this router

router = APIRouter(tags=["health"])

logger = logging.getLogger(__name__)

DATABASE_TIMEOUT_S = 2.0  # a database slower than this to answer `SELECT 1` is not ready


class Liveness(BaseModel):
    """The process answers."""

    status: Literal["ok"]


class Readiness(BaseModel):
    """Every check passed; `checks` says what each one found."""

    status: Literal["ready"]
    checks: dict[str, str]


@router.get("/healthz", response_model=Liveness, include_in_schema=False)
async def healthz() -> Liveness:
    """Liveness: the process answers (it checks nothing else, so a restart would not help)."""
    return Liveness(status="ok")


@router.get("/readyz", response_model=Readiness, include_in_schema=False)
async def readyz(request: Request) -> Readiness:
    """Readiness: the database answers within 2 s and the coordinator's loops run; else 503."""
    context: ApiContext = request.app.state.context
    database = await _database_check(context.db)
    running = sum(1 for loop in context.loops if loop.running)
    loops_ok = bool(context.loops) and running == len(context.loops)
    checks = {
        "database": database or "ok",
        "coordinator": f"{running} of {len(context.loops)} loops running",
    }
    passed = {"database": database is None, "coordinator": loops_ok}
    failed = [name for name, ok in passed.items() if not ok]
    if failed:
        raise Problem(
            503,
            "not-ready",
            "Not ready",
            "; ".join(f"{name}: {checks[name]}" for name in failed),
            checks=checks,
        )
    return Readiness(status="ready", checks=checks)


async def _database_check(db: Database) -> str | None:
    """None when the database answers `SELECT 1` in time, else what went wrong (no details)."""
    try:
        async with asyncio.timeout(DATABASE_TIMEOUT_S), db.read() as conn:
            await conn.execute(sa.text("SELECT 1"))
    except TimeoutError:
        logger.warning("health.database_timeout", extra={"timeout_s": DATABASE_TIMEOUT_S})
        return f"no answer within {DATABASE_TIMEOUT_S:g} s"
    except Exception as exc:
        # Any failure means "not ready"; the probe must answer 503, not 500.
        logger.warning(
            "health.database_unavailable", extra={"error": type(exc).__name__}, exc_info=exc
        )
        return f"unavailable ({type(exc).__name__})"
    return None
