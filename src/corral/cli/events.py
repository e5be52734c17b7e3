"""`corral events [-f]`: what changed in the cluster, from the audit log or live."""

from __future__ import annotations

import json
from contextlib import aclosing
from typing import Annotated

import typer

from corral.cli._remote import (
    call,
    local_time,
    print_json,
    print_json_line,
    print_table,
)
from corral.client import Client, Event, Page


def events_command(
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Print events live as they happen, until Ctrl-C.")
    ] = False,
    since: Annotated[
        int | None,
        typer.Option(min=0, help="Only events after this event id (-f: replays them first)."),
    ] = None,
    session: Annotated[
        str | None, typer.Option(help="Only this entity's events, e.g. a session id.")
    ] = None,
    limit: Annotated[
        int, typer.Option(min=1, max=1000, help="Without -f: at most this many events.")
    ] = 100,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON (with -f: one event per line).")
    ] = False,
) -> None:
    """List events (oldest first, from `--since`), or follow them live with -f."""
    if follow:
        call(lambda client: _follow(client, since, session, as_json))
        return
    page: Page[Event] = call(
        lambda client: client.events(since=since, entity_id=session, limit=limit)
    )
    if as_json:
        print_json(list(page.items))
        return
    if not page.items:
        typer.echo("no events", err=True)
    else:
        print_table(
            ["ID", "TIME", "KIND", "ENTITY", "DETAILS"],
            [
                [text_id(e), local_time(e.created_at), e.kind, _entity(e), summary(e)]
                for e in page.items
            ],
        )
    if page.next_cursor is not None and page.items:
        typer.echo(f"more events follow: add --since {page.items[-1].id}", err=True)


async def _follow(client: Client, since: int | None, entity: str | None, as_json: bool) -> None:
    events = client.follow_events(since=since, entity_id=entity)
    async with aclosing(events):
        async for event in events:
            if as_json:
                print_json_line(event)
            else:
                # A stream cannot be laid out as a table: fixed widths keep it aligned instead.
                typer.echo(
                    f"{text_id(event):>6}  {local_time(event.created_at)}  {event.kind:<24}  "
                    f"{_entity(event)}  {summary(event)}".rstrip()
                )


def text_id(event: Event) -> str:
    """The event's id as text (`-` for an unnumbered marker)."""
    return "-" if event.id is None else str(event.id)


def summary(event: Event) -> str:
    """One line about the change: `PENDING → SCHEDULED (why)` for status changes, else fields."""
    payload = event.payload
    if "from" in payload and "to" in payload:
        reason = f" ({payload['reason']})" if payload.get("reason") else ""
        return f"{payload['from']} → {payload['to']}{reason}"
    return " ".join(
        f"{key}={value if isinstance(value, str) else json.dumps(value)}"
        for key, value in payload.items()
    )


def _entity(event: Event) -> str:
    return f"{event.entity_type} {event.entity_id}"
