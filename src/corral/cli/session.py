"""`corral session ls | info | logs | history | explain | terminate | rm`: your sessions."""

from __future__ import annotations

import shlex
import shutil
import sys
from contextlib import aclosing
from datetime import UTC, datetime
from typing import Annotated

import typer

from corral.cli._common import fail
from corral.cli._remote import (
    JsonOption,
    SessionArgument,
    age,
    call,
    local_time,
    print_json,
    print_table,
    text,
)
from corral.cli.session_outputs import outputs_command
from corral.client import Client, Explanation, HistoryEntry, LogStream, Session
from corral.domain.status import SessionStatus
from corral.domain.time_limit import format_duration

app = typer.Typer(
    help="List and inspect sessions, read their logs, terminate and remove them.",
    no_args_is_help=True,
)


@app.command("ls")
def ls_command(
    status: Annotated[
        list[str] | None,
        typer.Option("--status", "-s", help="Only sessions in this status (repeatable)."),
    ] = None,
    every_owner: Annotated[
        bool, typer.Option("--all", "-a", help="Admins: every owner's sessions, not just yours.")
    ] = False,
    owner: Annotated[str | None, typer.Option(help="Admins: this user's sessions.")] = None,
    resource_group: Annotated[str | None, typer.Option(help="Only this resource group.")] = None,
    session_type: Annotated[
        str | None, typer.Option("--type", help="BATCH, INTERACTIVE or INFERENCE.")
    ] = None,
    array: Annotated[
        str | None, typer.Option(help="Only the elements of this job array (its id).")
    ] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help="At most this many, newest first (default: all).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """List sessions, newest first."""
    statuses = [_status(value) for value in status or ()]

    async def fetch(client: Client) -> list[Session]:
        chosen = owner
        if chosen is None and not every_owner:
            chosen = (await client.me()).name
        found: list[Session] = []
        sessions = client.iter_sessions(
            status=statuses or None,
            owner=chosen,
            resource_group=resource_group,
            type=session_type,
            array_id=array,
            page_size=min(limit or 1000, 1000),
        )
        async with aclosing(sessions):
            async for session in sessions:
                found.append(session)
                if limit is not None and len(found) >= limit:
                    break
        return found

    sessions = call(fetch)
    if as_json:
        print_json(sessions)
        return
    if not sessions:
        typer.echo("no sessions", err=True)
        return
    show_owner = every_owner or owner is not None
    print_table(
        [
            "ID",
            "NAME",
            *(["OWNER"] if show_owner else []),
            "STATUS",
            "TYPE",
            "SIZE",
            "RESOURCES",
            "GROUP",
            "AGE",
            "EXIT",
        ],
        [
            [
                str(s.id),
                text(s.name),
                *([s.owner] if show_owner else []),
                s.status.value,
                s.type,
                str(s.cluster_size),
                s.resources.format_human(),
                s.resource_group,
                age(s.created_at),
                text(s.exit_code),
            ]
            for s in sessions
        ],
    )


@app.command("info")
def info_command(session: SessionArgument, as_json: JsonOption = False) -> None:
    """Show a session in detail, with its kernels."""

    async def fetch(client: Client) -> Session:
        return await client.get_session(await client.resolve_session_id(session))

    found = call(fetch)
    if as_json:
        print_json(found)
        return
    print_table(None, _facts(found))
    if found.kernels:
        typer.echo("")
        print_table(
            ["KERNEL", "ROLE", "STATUS", "AGENT", "EXIT", "CAUSE", "INFO"],
            [
                [
                    str(k.cluster_index),
                    k.cluster_role,
                    k.status.value,
                    text(k.agent_id),
                    text(k.exit_code),
                    text(k.failure_cause),
                    text(k.status_info),
                ]
                for k in found.kernels
            ],
        )


def _facts(session: Session) -> list[list[str]]:
    status = session.status.value + (f" ({session.status_info})" if session.status_info else "")
    placement = f"{session.cluster_size} kernel(s), {session.cluster_mode}"
    facts = [
        ("id", str(session.id)),
        ("name", text(session.name)),
        ("owner", session.owner),
        ("type", session.type),
        ("status", status),
        ("result", text(session.result)),
        ("exit code", text(session.exit_code)),
        ("failure", text(session.failure_cause)),
        ("image", session.image),
        ("command", shlex.join(session.command) or "-"),
        ("resources", f"{session.resources.format_human()} per kernel; {placement}"),
        ("group", f"{session.resource_group}, priority {session.priority}"),
        ("created", f"{local_time(session.created_at)} ({age(session.created_at)} ago)"),
        ("started", local_time(session.started_at)),
        ("limit", _time_limit(session)),  # wall time
        ("ended", local_time(session.terminated_at)),
    ]
    return [[f"{key}:", value] for key, value in facts]


def _time_limit(session: Session) -> str:
    """The limit, and while it runs how much of it is left."""
    if session.time_limit_s is None:
        return "-"
    limit = format_duration(session.time_limit_s)
    if session.deadline_at is None or session.is_terminal:
        return limit
    left = (session.deadline_at - datetime.now(UTC)).total_seconds()
    return f"{limit} ({format_duration(left)} left)"


@app.command("logs")
def logs_command(
    session: SessionArgument,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow", "-f", help="Print the last screenful, then follow until the session ends."
        ),
    ] = False,
    stderr: Annotated[
        bool, typer.Option("--stderr", help="The kernels' stderr instead of their stdout.")
    ] = False,
    kernel: Annotated[
        int | None,
        typer.Option(min=0, help="Only this kernel (cluster index; 0 is the main one)."),
    ] = None,
    tail: Annotated[
        int | None, typer.Option("--tail", "-n", min=0, help="Only the last N lines (per kernel).")
    ] = None,
    since: Annotated[
        str | None,
        typer.Option(help="Only output stored since an age (30s, 10m, 2h, 1d) or an ISO time."),
    ] = None,
    timestamps: Annotated[
        bool,
        typer.Option("--timestamps", "-t", help="Prefix each line with the time it was stored."),
    ] = False,
) -> None:
    """Print the session's output: as written with one kernel, lines prefixed with several."""
    stream: LogStream = "stderr" if stderr else "stdout"
    out = sys.stdout.buffer
    if follow and tail is None and since is None:
        tail = screenful()

    async def copy(client: Client) -> None:
        session_id = await client.resolve_session_id(session)
        if not follow:
            out.write(
                await client.session_logs(
                    session_id,
                    stream=stream,
                    kernel=kernel,
                    tail=tail,
                    since=since,
                    timestamps=timestamps,
                )
            )
            out.flush()
            return
        chunks = client.follow_logs(
            session_id, stream=stream, kernel=kernel, tail=tail, since=since, timestamps=timestamps
        )
        async with aclosing(chunks):
            async for chunk in chunks:
                out.write(chunk)
                out.flush()

    call(copy)


def screenful() -> int:
    """The lines a terminal shows, less the prompt's (24 less one when not a terminal)."""
    return max(1, shutil.get_terminal_size().lines - 1)


@app.command("history")
def history_command(session: SessionArgument, as_json: JsonOption = False) -> None:
    """Show the session's scheduling phases: results, attempts, and why any failed."""

    async def fetch(client: Client) -> list[HistoryEntry]:
        return await client.session_history(await client.resolve_session_id(session))

    entries = call(fetch)
    if as_json:
        print_json(entries)
        return
    print_table(
        ["PHASE", "FROM", "TO", "RESULT", "ATTEMPTS", "CODE", "MESSAGE", "UPDATED"],
        [
            [
                e.phase,
                text(e.from_status),
                text(e.to_status),
                e.result,
                str(e.attempts),
                text(e.error_code),
                text(e.message),
                local_time(e.updated_at),
            ]
            for e in entries
        ],
    )


@app.command("explain")
def explain_command(session: SessionArgument, as_json: JsonOption = False) -> None:
    """Say where a session stands in its resource group's queue, and why it waits."""

    async def fetch(client: Client) -> Explanation:
        return await client.explain(await client.resolve_session_id(session))

    result = call(fetch)
    if as_json:
        print_json(result)
        return
    typer.echo(f"session {result.session_id}: {result.status.value}, {describe_place(result)}")
    code = f" ({result.code})" if result.code else ""
    typer.echo(f"  {result.outcome}{code}: {result.message}")


def describe_place(result: Explanation) -> str:
    """`position 2 of 5 in resource group 'gpu'`, or that the session is not queued."""
    if result.position is None:
        return f"not queued in resource group {result.resource_group!r}"
    return (
        f"position {result.position} of {result.queue_length} in resource group "
        f"{result.resource_group!r}"
    )


@app.command("terminate")
def terminate_command(session: SessionArgument) -> None:
    """End a session: cancel it if it has not started, else stop its kernels.

    A job array's id (its first element's) ends every element of the array.
    """

    async def request(client: Client) -> str:
        session_id = await client.resolve_session_id(session)
        found = await client.get_session(session_id)
        if found.array_id is not None and found.array_id == found.id:
            ended = await client.terminate_array(found.array_id)
            return (
                f"array {ended.id}: {ended.cancelled} cancelled, {ended.terminating} "
                f"terminating, {ended.unchanged} had already ended"
            )
        result = await client.terminate_session(session_id)
        if result.outcome == "unchanged":
            return f"session {result.id} had already ended ({result.status.value})"
        return f"session {result.id}: {result.outcome} ({result.status.value})"

    typer.echo(call(request))


@app.command("rm")
def rm_command(
    sessions: Annotated[
        list[str],
        typer.Argument(
            metavar="SESSION", help="Ended sessions to remove (ids, prefixes or names)."
        ),
    ],
) -> None:
    """Remove ended sessions with their logs and history (terminate running ones first)."""

    async def remove(client: Client) -> None:
        for ref in sessions:
            session_id = await client.resolve_session_id(ref)
            await client.delete_session(session_id)
            typer.echo(f"removed session {session_id}")

    call(remove)


app.command("outputs")(outputs_command)


def _status(value: str) -> str:
    try:
        return SessionStatus(value.upper()).value
    except ValueError:
        known = ", ".join(s.value for s in SessionStatus)
        fail(f"--status {value!r} is not a session status; use one of {known}")
