"""`corral explain SESSION`: where a pending session stands in its group's queue, and why."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from typing import Annotated

import typer

from corral.cli._common import fail, settings_from_flags
from corral.cli.db import DatabaseOption
from corral.scheduler.explain import Explanation, SessionNotFoundError, explain
from corral.store.database import Database
from corral.store.scheduling import UnknownResourceGroupError


def explain_command(
    session: Annotated[str, typer.Argument(help="The session id (as printed at submission).")],
    database: DatabaseOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Say where a session stands in its resource group's queue and why it is not placed."""
    try:
        session_id = uuid.UUID(session)
    except ValueError:
        fail(f"session: {session!r} is not a session id (expected a UUID)")
    url = settings_from_flags(database_url=database).resolved_database_url()

    async def run() -> Explanation:
        db = Database.open(url, pool_size=2)
        try:
            return await explain(db, session_id, datetime.now(UTC))
        finally:
            await db.close()

    try:
        result = asyncio.run(run())
    except (SessionNotFoundError, UnknownResourceGroupError) as exc:
        fail(str(exc), code=1)
    if as_json:
        typer.echo(json.dumps(result.as_json()))
        return
    where = (
        f"position {result.position} of {result.queue_length} in resource group "
        f"{result.resource_group!r}"
        if result.position is not None
        else f"not in resource group {result.resource_group!r}'s queue"
    )
    typer.echo(f"session {result.session_id}: {result.status.value}, {where}")
    typer.echo(f"  {result.outcome}{f' ({result.code})' if result.code else ''}: {result.message}")
