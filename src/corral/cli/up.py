"""`corral up`: a manager and a local agent on this machine, ready for `corral run`."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Annotated

import typer

from corral._logging import configure_logging
from corral.agent.kernel_worker import STOP_GRACE_S
from corral.cli._common import fail, settings_from_flags
from corral.cli.agent import PythonOption, detect_slots
from corral.manager.up import UpConfig, UpReady, run_up


def up_command(
    port: Annotated[int, typer.Option(min=0, max=65535, help="The API's port.")] = 8470,
    data_dir: Annotated[
        Path | None, typer.Option(help="Database, agent and kernel files (default: data_dir).")
    ] = None,
    agents: Annotated[
        int, typer.Option(min=1, max=16, help="Local agents sharing this machine (multi-node).")
    ] = 1,
    python: PythonOption = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING, ERROR.")] = "WARNING",
    proxy_port: Annotated[
        int,
        typer.Option(min=-1, max=65535, help="The serving proxy's port (0: a free one; -1: none)."),
    ] = 0,
    proxy_domain: Annotated[
        str | None,
        typer.Option(
            help="The proxy also routes `Host: <deployment>.DOMAIN` (e.g. localhost: "
            "http://NAME.localhost:PORT/)."
        ),
    ] = None,
) -> None:
    """Run corral on this machine (SQLite, one local agent) until Ctrl-C."""
    settings = settings_from_flags(data_dir=data_dir)
    configure_logging(log_level)
    config = UpConfig(
        data_dir=settings.data_dir.expanduser(),
        slots=detect_slots(),
        port=port,
        agents=agents,
        log_cap_bytes=settings.log_cap_bytes,
        retention_days=settings.retention_days,
        python=python,
        upload_max_bytes=settings.upload_max_bytes,
        unused_upload_hours=settings.unused_upload_hours,
        max_request_bytes=settings.max_request_bytes,
        max_kernel_slots=settings.max_kernel_slots,
        retry_policy_default=settings.retry_policy_default,
        token_ttl_s=settings.token_ttl_s(),
        proxy_port=None if proxy_port < 0 else proxy_port,
        proxy_domain=proxy_domain,
    )

    def ready(up: UpReady) -> None:
        from corral.client import write_client_config

        path = write_client_config(up.url, up.admin_token)
        typer.echo(f"corral is up at {up.url}, agents: {', '.join(up.agent_ids)}")
        typer.echo(f"dashboard: {up.url}/ui (sign in with the admin token)")
        kept = "new, kept" if up.new_token else "kept"
        typer.echo(f"admin token: {up.admin_token} ({kept} in {up.token_file})")
        if up.proxy_url is not None:
            typer.echo(f"deployments served at {up.proxy_url}/<deployment>/ (corral deploy)")
            if proxy_domain is not None:
                port = up.proxy_url.rpartition(":")[2]
                typer.echo(f"  and at http://<deployment>.{proxy_domain.strip('.')}:{port}/")
        typer.echo(f"client config written to {path}; try:")
        typer.echo("  corral run -- python -c \"print('hello')\"")
        typer.echo("Ctrl-C stops corral (running sessions are stopped; twice: at once).")

    async def main() -> None:
        stop, kill_now = asyncio.Event(), asyncio.Event()

        def signalled() -> None:
            if stop.is_set():
                kill_now.set()
                return
            stop.set()
            typer.echo(
                f"stopping: running kernels get SIGTERM, then SIGKILL after {STOP_GRACE_S:g} s; "
                "Ctrl-C again to kill them now",
                err=True,
            )

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, signalled)
        await run_up(config, ready, stop, kill_now)

    try:
        asyncio.run(main())
    except (OSError, ValueError) as exc:
        fail(str(exc))
