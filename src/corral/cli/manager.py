"""`corral manager`: run a manager daemon (API, coordinator loops, lost-agent sweep)."""

from __future__ import annotations

import asyncio
import secrets
import socket
import ssl
from pathlib import Path
from typing import Annotated

import typer

from corral._logging import configure_logging
from corral._private_file import write_private
from corral.cli._common import fail, settings_from_flags
from corral.infra import DEFAULT_PREFIX


def manager_command(
    database: Annotated[
        str | None, typer.Option(help="sqlite:///path or postgresql://... (CORRAL_DATABASE_URL)")
    ] = None,
    redis: Annotated[
        str | None, typer.Option(help="redis://host:port/db for hints, locks, events")
    ] = None,
    host: Annotated[str, typer.Option(help="Address the API listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: any free).")] = 8470,
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            help="Serve HTTPS with this certificate (PEM, the chain after it); needs --tls-key."
        ),
    ] = None,
    tls_key: Annotated[
        Path | None, typer.Option(help="The private key (PEM) of --tls-cert.")
    ] = None,
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
    if (tls_cert is None) != (tls_key is None):
        fail("--tls-cert and --tls-key go together: give the certificate and its key, or neither")
    settings = settings_from_flags(
        database_url=database, redis_url=redis, heartbeat_timeout_s=heartbeat_timeout
    )
    token = join_token or (
        settings.join_token.get_secret_value() if settings.join_token is not None else None
    )
    generated = token is None
    token = token or secrets.token_urlsafe(24)
    configure_logging(log_level)
    if settings.redis_url is not None:
        _free_predecessor_locks(settings.redis_url, host, port, settings.lock_ttl_s, DEFAULT_PREFIX)
    # Loaded only now: most of a manager's start is importing this (issue 32).
    from corral.controller.agents import AgentTimings
    from corral.coordination.manager import LoopIntervals
    from corral.manager.daemon import ManagerConfig, run_manager

    config = ManagerConfig(
        database_url=settings.resolved_database_url(),
        redis_url=settings.redis_url,
        host=host,
        port=port,
        tls_cert=tls_cert,
        tls_key=tls_key,
        join_token=token,
        timings=AgentTimings(
            heartbeat_timeout_s=settings.heartbeat_timeout_s,
            assignment_wait_s=settings.assignment_wait_s,
            poll_recheck_s=settings.short_interval_s,
        ),
        intervals=LoopIntervals(
            short_interval_s=settings.short_interval_s, long_interval_s=settings.long_interval_s
        ),
        log_cap_bytes=settings.log_cap_bytes,
        retention_days=settings.retention_days,
        lock_ttl_s=settings.lock_ttl_s,
        max_array_size=settings.max_array_size,
        upload_max_bytes=settings.upload_max_bytes,
        unused_upload_hours=settings.unused_upload_hours,
        max_request_bytes=settings.max_request_bytes,
        max_kernel_slots=settings.max_kernel_slots,
        retry_policy_default=settings.retry_policy_default,
    )

    token_file = settings.data_dir.expanduser() / "join-token"
    if generated:
        # Kept out of the logs and the console: agents' operators read it from this file.
        _write_secret(token_file, token)

    def on_ready(url: str) -> None:
        typer.echo(f"corral manager listening on {url}", err=True)
        if generated:
            typer.echo(f"agent join token written to {token_file}", err=True)

    try:
        run_manager(config, on_ready)
    except (OSError, ssl.SSLError) as exc:
        fail(str(exc))


def _free_predecessor_locks(
    redis_url: str, host: str, port: int, ttl_s: float, prefix: str
) -> None:
    """A manager killed on this address may hold task locks that every manager waits out
    until their TTL: when the port can be bound (so that process is gone), free them before
    the seconds the rest of the start takes. The daemon's own take-over, once bound, stays."""
    if port == 0:
        return  # a new address each start: no predecessor to name
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind((host, port))
    except OSError:
        return  # taken (the daemon says so) or not ours to bind
    finally:
        probe.close()
    from corral.infra.locks import address_owner
    from corral.infra.locks.redis import free_predecessor_locks

    asyncio.run(
        free_predecessor_locks(redis_url, prefix=prefix, owner=address_owner(port), ttl_s=ttl_s)
    )


def _write_secret(path: Path, secret: str) -> None:
    """Write `secret` to `path`, readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_private(path, secret + "\n")
