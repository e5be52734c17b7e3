"""`corral events [-f]`: what changed in the cluster, from the audit log or live."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from typing import Annotated

import typer

from corral.cli._common import fail
from corral.cli._remote import (
    call,
    local_time,
    print_json,
    print_json_line,
    print_table,
)
from corral.client import Client, Event, Page

DEFAULT_TAIL = 20  # about a screenful


def events_command(
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="After the last events, print new ones live, until Ctrl-C."
        ),
    ] = False,
    tail: Annotated[
        int | None,
        typer.Option(
            "--tail", "-n", min=1, max=1000, help=f"The last N events [default: {DEFAULT_TAIL}]."
        ),
    ] = None,
    since: Annotated[
        int | None,
        typer.Option(min=0, help="Instead of the last events: those after this event id."),
    ] = None,
    session: Annotated[
        str | None,
        typer.Option(help="Only this session's events: its number, id, id prefix or name."),
    ] = None,
    limit: Annotated[
        int, typer.Option(min=1, max=1000, help="With --since: at most this many events.")
    ] = 100,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON (with -f: one event per line).")
    ] = False,
) -> None:
    """List the last events, newest last (or those after `--since`); -f then follows them."""
    if since is not None and tail is not None:
        fail("give --tail or --since, not both")

    async def fetch(client: Client) -> tuple[str | None, Page[Event]]:
        entity = None if session is None else str(await client.resolve_session_id(session))
        if since is not None:
            return entity, await client.events(since=since, entity_id=entity, limit=limit)
        return entity, await client.events(entity_id=entity, tail=tail or DEFAULT_TAIL)

    if follow:
        call(lambda client: _follow(client, fetch, as_json))
        return
    _, page = call(fetch)
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
    if since is not None and page.next_cursor is not None and page.items:
        typer.echo(f"more events follow: add --since {page.items[-1].id}", err=True)


async def _follow(
    client: Client,
    fetch: Callable[[Client], Awaitable[tuple[str | None, Page[Event]]]],
    as_json: bool,
) -> None:
    """The last events, then the stream from the last one shown on: none missed, none twice."""
    entity, page = await fetch(client)
    for event in page.items:
        _print_line(event, as_json)
    # Nothing shown: from the first event on, the stream replays what came in between.
    last = page.items[-1].id if page.items else 0
    events = client.follow_events(since=last, entity_id=entity)
    async with aclosing(events):
        async for event in events:
            _print_line(event, as_json)


def _print_line(event: Event, as_json: bool) -> None:
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
