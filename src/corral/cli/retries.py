"""`corral retries status | pause | resume`: the cluster's automatic retries (admins flip them).

Pausing is the kill switch of a retry storm: no manager decides a retry while it is on (failed
sessions wait for their decision), and resuming decides them. It is kept in the database, so
every manager obeys it at once, whichever was asked.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

from corral.cli._remote import JsonOption, call, local_time, print_json, print_table, text
from corral.client import Client, RetrySettings

app = typer.Typer(
    help="Automatic session retries: whether they are paused, and the cluster's default policy.",
    no_args_is_help=True,
)

ReasonOption = Annotated[
    str | None, typer.Option(help="Why (shown to everyone who asks), e.g. 'registry outage'.")
]


@app.command("status")
def status_command(as_json: JsonOption = False) -> None:
    """Whether automatic retries are paused, and the cluster's default retry policy."""

    async def fetch(client: Client) -> RetrySettings:
        return await client.retry_settings()

    _show(call(fetch), as_json)


@app.command("pause")
def pause_command(reason: ReasonOption = None, as_json: JsonOption = False) -> None:
    """Admins: pause automatic retries cluster-wide (failed sessions wait to be decided)."""

    async def pause(client: Client) -> RetrySettings:
        return await client.set_retries_paused(True, reason)

    _show(call(pause), as_json)


@app.command("resume")
def resume_command(reason: ReasonOption = None, as_json: JsonOption = False) -> None:
    """Admins: resume automatic retries; the failures that waited are decided now."""

    async def resume(client: Client) -> RetrySettings:
        return await client.set_retries_paused(False, reason)

    _show(call(resume), as_json)


def _show(settings: RetrySettings, as_json: bool) -> None:
    if as_json:
        print_json(settings)
        return
    state = "paused" if settings.paused else "on"
    print_table(
        None,
        [
            ["retries:", state + (f" ({settings.reason})" if settings.reason else "")],
            ["changed:", f"{local_time(settings.changed_at)} by {text(settings.changed_by)}"],
            ["default:", json.dumps(settings.cluster_default, sort_keys=True)],
        ],
    )
