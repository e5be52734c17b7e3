"""`corral admin bootstrap`: the first admin of a cluster, made on its database directly."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Annotated

import typer

from corral.cli._common import FAILURE_EXIT, fail, settings_from_flags
from corral.cli.db import DatabaseOption
from corral.cli.tokens_cli import ExpiresInOption, NoExpiryOption, token_lifetime
from corral.domain.tokens import token_expiry
from corral.domain.types import USER_NAME_PATTERN, utcnow
from corral.store.admin_bootstrap import (
    AdminExistsError,
    Bootstrapped,
    NotAnAdminError,
    bootstrap_admin,
)
from corral.store.database import Database
from corral.store.migrate import upgrade

app = typer.Typer(help="Cluster administration on the database itself.", no_args_is_help=True)


@app.callback()
def _admin() -> None:
    """Cluster administration on the database itself (no manager, no token needed)."""


@app.command("bootstrap")
def bootstrap_command(
    database: DatabaseOption = None,
    data_dir: Annotated[
        Path | None,
        typer.Option(help="The data directory whose corral.db to use (without --database)."),
    ] = None,
    name: Annotated[str, typer.Option(help="The admin's user name.")] = "admin",
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Mint an admin token even though the cluster has an admin (a lost token), "
            "making NAME an admin if it is a plain user.",
        ),
    ] = False,
    expires_in: ExpiresInOption = None,
    no_expiry: NoExpiryOption = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Make the cluster's first admin and print its token once (on stdout).

    Works on the database (like `corral db`), with no manager running and no token: whoever
    may open the database may make an admin. Once the cluster has an admin this is refused
    unless --force; admins then make users and tokens (`corral user create`).
    """
    if re.fullmatch(USER_NAME_PATTERN, name) is None:
        fail(f"--name {name!r}: use 1 to 64 letters, digits, '.', '_' or '-'")
    lifetime = token_lifetime(expires_in, no_expiry)
    settings = settings_from_flags(database_url=database, data_dir=data_dir)
    seconds = None if lifetime.never else lifetime.seconds or settings.token_ttl_s()

    async def run() -> Bootstrapped:
        db = Database.open(settings.resolved_database_url(), pool_size=1)
        try:
            await upgrade(db)  # as a manager does when it starts: safe to repeat
            now = utcnow()
            return await bootstrap_admin(
                db, name, now, expires_at=token_expiry(now, seconds), force=force
            )
        finally:
            await db.close()

    try:
        done = asyncio.run(run())
    except (AdminExistsError, NotAnAdminError) as exc:
        fail(str(exc), code=FAILURE_EXIT)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "user": done.user,
                    "created": done.created,
                    "promoted": done.promoted,
                    "token_id": str(done.token.id),
                    "token": done.token.secret,
                    "expires_at": None if done.expires_at is None else done.expires_at.isoformat(),
                }
            )
        )
        return
    made = "created" if done.created else "made an admin" if done.promoted else "exists"
    expiry = "never expires" if done.expires_at is None else f"expires {done.expires_at:%Y-%m-%d}"
    typer.echo(
        f"admin {done.user} {made}; its token ({done.token.id}, {expiry}) is shown only now. "
        "Give it to the CLI: CORRAL_URL=http://<manager>:8470 CORRAL_TOKEN=<token>",
        err=True,
    )
    typer.echo(done.token.secret)
