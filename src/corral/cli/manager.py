"""`corral manager`: run a manager daemon (API, coordinator loops, lost-agent sweep)."""

from __future__ import annotations

import secrets
from typing import Annotated

import typer

from corral.cli._common import fail, settings_from_flags
from corral.cli._logging import configure_logging
from corral.controller.agents import AgentTimings
from corral.coordination.manager import LoopIntervals
from corral.manager.daemon import ManagerConfig, run_manager


def manager_command(
    database: Annotated[
        str | None, typer.Option(help="sqlite:///path or postgresql://... (CORRAL_DATABASE_URL)")
    ] = None,
    redis: Annotated[
        str | None, typer.Option(help="redis://host:port/db for hints, locks, events")
    ] = None,
    host: Annotated[str, typer.Option(help="Address the API listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free).")] = 8470,
    join_token: Annotated[
        str | None,
        typer.Option(
            envvar="CORRAL_JOIN_TOKEN",
            help="The secret agents present to join; generated and printed when not given.",
        ),
    ] = None,
    heartbeat_timeout: Annotated[
        float | None, typer.Option(min=0.1, help="Seconds of agent silence before LOST.")
    ] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ERROR.")] = "INFO",
) -> None:
    """Run a manager until Ctrl-C / SIGTERM."""
    settings = settings_from_flags(
        database_url=database, redis_url=redis, heartbeat_timeout_s=heartbeat_timeout
    )
    token = join_token or (
        settings.join_token.get_secret_value() if settings.join_token is not None else None
    )
    generated = token is None
    token = token or secrets.token_urlsafe(24)
    configure_logging(log_level)
    config = ManagerConfig(
        database_url=settings.resolved_database_url(),
        redis_url=settings.redis_url,
        host=host,
        port=port,
        join_token=token,
        timings=AgentTimings(
            heartbeat_timeout_s=settings.heartbeat_timeout_s,
            assignment_wait_s=settings.assignment_wait_s,
            poll_recheck_s=settings.short_interval_s,
        ),
        intervals=LoopIntervals(
            short_interval_s=settings.short_interval_s, long_interval_s=settings.long_interval_s
        ),
    )

    def on_ready(url: str) -> None:
        typer.echo(f"corral manager listening on {url}", err=True)
        if generated:
            # Printed once to the console (not to the logs): agents need it to join.
            typer.echo(f"agent join token: {token}", err=True)

    try:
        run_manager(config, on_ready)
    except OSError as exc:
        fail(str(exc))
