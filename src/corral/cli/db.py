"""`corral db`: create or upgrade the schema of corral's database, and say where it stands."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer

from corral.cli._common import settings_from_flags
from corral.store.database import Database
from corral.store.migrate import current_revision, head_revision, upgrade

app = typer.Typer(help="The database: schema upgrade and status.", no_args_is_help=True)

DatabaseOption = Annotated[
    str | None,
    typer.Option(
        "--database",
        help="sqlite:///path or postgresql://user@host:port/db "
        "(default: CORRAL_DATABASE_URL, corral.toml, else corral.db in the data directory).",
    ),
]


def _redacted(url: str) -> str:
    from sqlalchemy import make_url

    return make_url(url).render_as_string(hide_password=True)


@app.command("upgrade")
def upgrade_command(database: DatabaseOption = None) -> None:
    """Create the schema, or bring it up to this version of corral (safe to repeat)."""
    url = settings_from_flags(database_url=database).resolved_database_url()

    async def run() -> str | None:
        db = Database.open(url, pool_size=1)
        try:
            await upgrade(db)
            return await current_revision(db)
        finally:
            await db.close()

    revision = asyncio.run(run())
    typer.echo(f"{_redacted(url)}: schema at revision {revision}")


@app.command("status")
def status_command(
    database: DatabaseOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Say which schema revision the database is at and whether it is current."""
    url = settings_from_flags(database_url=database).resolved_database_url()

    async def run() -> str | None:
        db = Database.open(url, pool_size=1)
        try:
            return await current_revision(db)
        finally:
            await db.close()

    revision = asyncio.run(run())
    head = head_revision()
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "database": _redacted(url),
                    "revision": revision,
                    "head": head,
                    "current": revision == head,
                }
            )
        )
        return
    state = "current" if revision == head else f"behind (head is {head}): run `corral db upgrade`"
    typer.echo(f"{_redacted(url)}: revision {revision or 'none (empty)'}, {state}")
