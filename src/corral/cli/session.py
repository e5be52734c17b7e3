"""`corral session ls | info | logs | history | attempts | explain | terminate | rm`."""

from __future__ import annotations

import shlex
import shutil
import sys
from collections.abc import Mapping
from contextlib import aclosing
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from corral.cli._common import FAILURE_EXIT, fail
from corral.cli._plain import plain, unexpected
from corral.cli._remote import (
    JsonOption,
    SessionArgument,
    age,
    call,
    local_time,
    names_array,
    print_json,
    print_table,
    text,
)
from corral.cli.session_outputs import outputs_command
from corral.client._http import array_path
from corral.client.errors import ConflictError
from corral.domain.record import record
from corral.domain.refs import collapse_indexes, session_ref
from corral.domain.status import SESSION_TERMINAL, SessionStatus
from corral.domain.time_limit import format_duration
from corral.domain.types import ADMIN_ROLE

# The SDK's client and models are imported by the commands that use them: `session ls` reads
# the API's JSON through `_plain` and starts without them.
if TYPE_CHECKING:
    from corral.client import (
        ArrayView,
        Attempts,
        Client,
        Explanation,
        HistoryEntry,
        LogStream,
        Session,
    )
    from corral.client._http import PlainCall


app = typer.Typer(
    help="List and inspect sessions, read their logs, terminate and remove them.",
    no_args_is_help=True,
)


@app.command("ls")
def ls_command(
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state",
            "--status",
            "-s",
            help="Only sessions in these states: S[,S...] (repeatable; default: active ones).",
        ),
    ] = None,
    all_states: Annotated[
        bool, typer.Option("--all-states", help="Ended sessions too, not only active ones.")
    ] = False,
    since: Annotated[
        str | None,
        typer.Option(help="Only sessions created since an age (30m, 2h, 1d) or an ISO time."),
    ] = None,
    every_owner: Annotated[
        bool, typer.Option("--all", "-a", help="Admins: every user's sessions, not just yours.")
    ] = False,
    user: Annotated[
        str | None, typer.Option("--user", "--owner", help="Admins: this user's sessions.")
    ] = None,
    resource_group: Annotated[str | None, typer.Option(help="Only this resource group.")] = None,
    session_type: Annotated[
        str | None, typer.Option("--type", help="BATCH, INTERACTIVE or INFERENCE.")
    ] = None,
    array: Annotated[
        str | None,
        typer.Option(
            help="The elements of this job array (its number), one a line, in every state by "
            "default."
        ),
    ] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help="At most this many, newest first (default: all).")
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """List sessions, newest first: active ones (not yet ended) unless told otherwise.

    A PENDING session's REASON says why it waits (`corral session explain` says more). A job
    array's element is shown as 12_7, and its pending elements waiting for the same reason as
    one line, like squeue: 12_[3-9%2] (elements 3 to 9, at most 2 at once); `--array 12`
    lists them one a line.
    """
    if state and all_states:
        fail("--state and --all-states: give one or the other")
    statuses = [_status(value) for item in state or () for value in item.split(",") if value]
    # An array's elements are listed whole, like `sacct -j`: its ended ones are its results.
    if not statuses and not all_states and array is None:
        statuses = [s.value for s in SessionStatus if s not in SESSION_TERMINAL]

    def fetch(api: PlainCall) -> tuple[list[Mapping[str, Any]], list[Listed]]:
        try:
            me = api.json("GET", "/v1/me")
            name, is_admin = me["name"], me["role"] == ADMIN_ROLE
        except (KeyError, TypeError) as exc:
            raise unexpected(api, "GET /v1/me", exc) from exc
        if (every_owner or user not in (None, name)) and not is_admin:
            what = "--all" if every_owner else "--user"
            fail(f"{what} lists other users' sessions, which needs an admin; you are {name}")
        array_id = None
        if array is not None:
            try:
                array_id = api.json("GET", array_path(array))["id"]
            except (KeyError, TypeError) as exc:
                raise unexpected(api, f"GET {array_path(array)}", exc) from exc
        params = {
            "status": statuses or None,
            "owner": user if user is not None or every_owner else name,
            "resource_group": resource_group,
            "type": session_type,
            "array_id": array_id,
            "since": since,
            "reasons": True,
            "limit": min(limit or 1000, 1000),
        }
        found: list[Mapping[str, Any]] = []
        for item in api.items("/v1/sessions", params):
            found.append(item)
            if limit is not None and len(found) >= limit:
                break
        try:
            return found, [Listed.of(item) for item in found]
        except (KeyError, TypeError, ValueError) as exc:
            raise unexpected(api, "GET /v1/sessions", exc) from exc

    items, sessions = plain(fetch)
    if as_json:
        print_json(items)  # the API's JSON as it came
        return
    if not sessions:
        typer.echo("no sessions" if all_states or state else "no active sessions", err=True)
        return
    show_user = every_owner or user is not None
    now = datetime.now(UTC)
    print_table(
        [
            "NUMBER",
            "NAME",
            *(["USER"] if show_user else []),
            "STATUS",
            "REASON",
            "GROUP",
            "AGE",
            "TIME",
            "EXIT",
        ],
        [
            [
                ref,
                text(s.name),
                *([s.owner] if show_user else []),
                s.status.value,
                text(s.reason),
                s.resource_group,
                age(s.created_at, now),
                _run_time(s, now),
                text(s.exit_code),
            ]
            for ref, s in (_one_a_line(sessions) if array else _collapsed(sessions))
        ],
    )


@record
class Listed:
    """A session as `session ls` shows it, read from the API's JSON (`Session`'s fields)."""

    number: int
    name: str | None
    owner: str
    status: SessionStatus
    reason: str | None
    resource_group: str
    created_at: datetime
    started_at: datetime | None
    terminated_at: datetime | None
    exit_code: int | None
    array_number: int | None
    array_index: int | None
    array_throttle: int | None

    @classmethod
    def of(cls, item: Mapping[str, Any]) -> Listed:
        """`item` of `GET /v1/sessions`; KeyError, TypeError or ValueError if it is not one."""
        return cls(
            number=int(item["number"]),
            name=item.get("name"),
            owner=item["owner"],
            status=SessionStatus(item["status"]),
            reason=item.get("reason"),
            resource_group=item["resource_group"],
            created_at=datetime.fromisoformat(item["created_at"]),
            started_at=_moment(item.get("started_at")),
            terminated_at=_moment(item.get("terminated_at")),
            exit_code=item.get("exit_code"),
            array_number=item.get("array_number"),
            array_index=item.get("array_index"),
            array_throttle=item.get("array_throttle"),
        )

    @property
    def ref(self) -> str:
        """What to type for it: `12_7` for a job array's element, else its number."""
        return session_ref(self.number, self.array_number, self.array_index)


def _moment(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _one_a_line(sessions: list[Listed]) -> list[tuple[str, Listed]]:
    return [(s.ref, s) for s in sessions]


def _collapsed(sessions: list[Listed]) -> list[tuple[str, Listed]]:
    """squeue's view: a job array's PENDING elements waiting for the same reason as one row,
    `12_[3-9%2]`, where the newest of them is listed."""
    waiting: dict[tuple[int, str | None], list[int]] = {}
    for s in sessions:
        if (
            s.array_number is not None
            and s.array_index is not None
            and s.status is SessionStatus.PENDING
        ):
            waiting.setdefault((s.array_number, s.reason), []).append(s.array_index)
    rows: list[tuple[str, Listed]] = []
    shown: set[tuple[int, str | None]] = set()
    for s in sessions:
        key = (s.array_number or 0, s.reason)
        indexes = (
            waiting.get(key, [])
            if s.array_number is not None and s.status is SessionStatus.PENDING
            else []
        )
        if len(indexes) < 2:
            rows.append((s.ref, s))
        elif key not in shown:
            shown.add(key)
            rows.append((f"{key[0]}_{collapse_indexes(indexes, s.array_throttle)}", s))
    return rows


def _run_time(session: Listed, now: datetime) -> str:
    """How long the session ran (runs), squeue's TIME: `-` if it never started."""
    if session.started_at is None:
        return "-"
    return age(session.started_at, session.terminated_at or now)


@app.command("info")
def info_command(session: SessionArgument, as_json: JsonOption = False) -> None:
    """Show a session in detail, with its kernels; or a job array (its number) as a whole:
    its elements per state, and each one."""

    async def fetch(client: Client) -> Session | ArrayView:
        try:
            return await client.get_session(session)
        except ConflictError as exc:
            if not names_array(exc):
                raise
            return await client.get_array(session)

    found = call(fetch)
    if as_json:
        print_json(found)
        return
    from corral.client import ArrayView

    if isinstance(found, ArrayView):
        _show_array(found)
        return
    print_table(None, _facts(found))
    if found.kernels:
        typer.echo("")
        print_table(
            ["KERNEL", "ROLE", "STATUS", "AGENT", "RESTARTS", "EXIT", "CAUSE", "INFO"],
            [
                [
                    str(k.cluster_index),
                    k.cluster_role,
                    k.status.value,
                    text(k.agent_id),
                    str(k.restarts) + (" (restarting)" if k.restarting else ""),
                    text(k.exit_code),
                    text(k.failure_cause),
                    text(k.status_info),
                ]
                for k in found.kernels
            ],
        )


def _show_array(array: ArrayView) -> None:
    """A job array as `scontrol show job` shows one: the whole, then its elements, runs of
    consecutive ones that stand alike on one line."""
    throttle = f", at most {array.throttle} at once" if array.throttle else ""
    states = ", ".join(f"{n} {status}" for status, n in sorted(array.statuses.items()))
    results = ", ".join(f"{n} {result}" for result, n in sorted(array.results.items()))
    facts = [
        ("array", str(array.number)),
        ("id", str(array.id)),
        ("name", text(array.name)),
        ("owner", array.owner),
        ("elements", f"{array.count}{throttle}"),
        ("states", states or "-"),
        ("results", results or "-"),
        ("image", array.image),
        ("command", shlex.join(array.command) or "-"),
        ("resources", f"{array.resources.format_human()} per kernel"),
        ("group", array.resource_group),
        ("created", f"{local_time(array.created_at)} ({age(array.created_at)} ago)"),
    ]
    print_table(None, [[f"{key}:", value] for key, value in facts])
    runs: list[tuple[tuple[str, str, str], list[int]]] = []
    for e in array.elements:
        shape = (e.status.value, text(e.result), text(e.exit_code))
        if runs and runs[-1][0] == shape:
            runs[-1][1].append(e.index)
        else:
            runs.append((shape, [e.index]))
    typer.echo("")
    print_table(
        ["ELEMENTS", "STATUS", "RESULT", "EXIT"],
        [[f"{array.number}_{collapse_indexes(indexes)}", *shape] for shape, indexes in runs],
    )


def _facts(session: Session) -> list[list[str]]:
    status = session.status.value + (f" ({session.status_info})" if session.status_info else "")
    placement = f"{session.cluster_size} kernel(s), {session.cluster_mode}"
    in_array = (
        f"element {session.array_index} of job array {session.array_number}"
        if session.array_number is not None
        else None
    )
    facts = [
        ("number", session.ref if in_array is None else f"{session.number} ({session.ref})"),
        ("array", text(in_array)),
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
        ("workdir", _start_dir(session)),
        ("upload", text(session.upload)),  # the sha256 of the directory sent
        ("after", _dependencies(session)),
        ("resources", f"{session.resources.format_human()} per kernel; {placement}"),
        ("group", f"{session.resource_group}, priority {session.priority}"),
        ("created", f"{local_time(session.created_at)} ({age(session.created_at)} ago)"),
        ("started", local_time(session.started_at)),
        ("limit", _time_limit(session)),  # wall time
        ("ended", local_time(session.terminated_at)),
        *_retry_facts(session),
        *_restart_facts(session),
        *_admission_facts(session),
    ]
    return [[f"{key}:", value] for key, value in facts]


def _restart_facts(session: Session) -> list[tuple[str, str]]:
    """The kernel restart policy: the limit per kernel and the restarts made (none if off)."""
    if not session.restart_limit:
        return []
    made = "" if session.restarts is None else f"; {session.restarts} made"
    return [("restarts", f"up to {session.restart_limit} per kernel{made}")]


def _admission_facts(session: Session) -> list[tuple[str, str]]:
    """The KernelsReady condition and the requeue state (none for a session that has neither)."""
    facts: list[tuple[str, str]] = []
    if session.kernels_ready is not None:
        ready = "yes" if session.kernels_ready else "no"
        since = local_time(session.kernels_ready_at)
        facts.append(("kernels ready", f"{ready} ({session.kernels_ready_reason}, since {since})"))
    if session.requeue_count:
        requeue = f"evicted {session.requeue_count} time(s), last {local_time(session.evicted_at)}"
        if session.eviction_reason:
            requeue += f" ({session.eviction_reason})"
        facts.append(("requeue", requeue))
    if session.requeue_at is not None and session.active:
        facts.append(("next requeue", local_time(session.requeue_at)))
    if not session.active:
        facts.append(
            (
                "active",
                f"no: deactivated {local_time(session.deactivated_at)}; "
                f"`corral session activate {session.ref}` queues it again",
            )
        )
    return facts


def _dependencies(session: Session) -> str:
    """What it waits for, as `--after` takes it: `afterok:ID, afterany:ID`."""
    if not session.dependencies:
        return "-"
    return ", ".join(f"{d.kind}:{d.session}" for d in session.dependencies)


def _start_dir(session: Session) -> str:
    """Where the kernels start: the upload unpacked in each kernel's own directory, or the
    submitting directory."""
    if session.upload is not None:
        return "the upload, unpacked in each kernel's own directory"
    return text(session.workdir)


def _retry_facts(session: Session) -> list[tuple[str, str]]:
    """Where the session stands in its retry chain, with the chain's links (none without)."""
    if not session.max_retries and not session.retry_count:
        return []
    attempt = f"{session.retry_count + 1} of {session.max_retries + 1}"
    if session.parent_session_id is not None:
        attempt += f", retrying {session.parent_session_id} after {text(session.retry_cause)}"
    facts = [("attempt", attempt), ("retry", text(session.retry_state))]
    if session.retry_chain:
        chain = " → ".join(
            f"[{sid}]" if sid == session.id else str(sid) for sid in session.retry_chain
        )
        facts.append(("chain", f"{chain} (`corral session attempts {session.number}`)"))
    return facts


@app.command("attempts")
def attempts_command(session: SessionArgument, as_json: JsonOption = False) -> None:
    """List the attempts of the session's retry chain, oldest first, and how each ended."""

    async def fetch(client: Client) -> Attempts:
        return await client.session_attempts(session)

    found = call(fetch)
    if as_json:
        print_json(found)
        return
    if found.retry_state:
        typer.echo(found.retry_state, err=True)
    total = found.max_retries + 1
    print_table(
        ["ATTEMPT", "NUMBER", "STATUS", "RESULT", "CAUSE", "RETRIES", "EXIT", "STARTED", "ENDED"],
        [
            [
                f"{a.attempt}/{total}",
                str(a.number),
                a.status.value,
                text(a.result),
                text(a.failure_cause),
                text(a.retry_cause),
                text(a.exit_code),
                local_time(a.started_at),
                local_time(a.terminated_at),
            ]
            for a in found.items
        ],
    )


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
        if not follow:
            out.write(
                await client.session_logs(
                    session,
                    stream=stream,
                    kernel=kernel,
                    tail=tail,
                    since=since,
                    timestamps=timestamps,
                )
            )
            out.flush()
            return
        # By id from here on: a name may come to mean a newer session while this follows.
        session_id = await client.resolve_session_id(session)
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
        return await client.session_history(session)

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
        return await client.explain(session)

    result = call(fetch)
    if as_json:
        print_json(result)
        return
    typer.echo(f"session {result.number}: {result.status.value}, {describe_place(result)}")
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

    A job array's number (12) ends every element of the array; 12_7 ends element 7 alone.
    """

    async def request(client: Client) -> str:
        try:
            result = await client.terminate_session(session)
        except ConflictError as exc:
            if not names_array(exc):
                raise
            ended = await client.terminate_array(session)
            return (
                f"array {ended.number}: {ended.cancelled} cancelled, {ended.terminating} "
                f"terminating, {ended.unchanged} had already ended"
            )
        if result.outcome == "unchanged":
            said = f"session {result.number} had already ended ({result.status.value})"
        else:
            said = f"session {result.number}: {result.outcome} ({result.status.value})"
        return f"{said}; {result.message}" if result.message else said

    typer.echo(call(request))


@app.command("activate")
def activate_command(session: SessionArgument) -> None:
    """Put a session that all-or-nothing admission deactivated (its kernels were not ready in
    time too often) back in the queue, with a fresh requeue count."""
    result = call(lambda client: client.activate_session(session))
    if result.outcome == "unchanged":
        fail(f"session {result.number}: {result.message}", code=FAILURE_EXIT)
    typer.echo(f"session {result.number}: activated ({result.status.value}), back in the queue")


@app.command("rm")
def rm_command(
    sessions: Annotated[
        list[str],
        typer.Argument(
            metavar="SESSION",
            help="Ended sessions to remove (numbers, ids, unique id prefixes or names; a job "
            "array's number removes every element).",
        ),
    ],
) -> None:
    """Remove ended sessions with their logs and history (terminate running ones first)."""

    async def remove(client: Client) -> None:
        for ref in sessions:
            try:
                found = await client.get_session(ref)
            except ConflictError as exc:
                if not names_array(exc):
                    raise
                removed = await client.delete_array(ref)
                typer.echo(f"removed job array {removed.number} ({removed.removed} sessions)")
                continue
            await client.delete_session(found.id)
            typer.echo(f"removed session {found.ref} ({found.id})")

    call(remove)


app.command("outputs")(outputs_command)


def _status(value: str) -> str:
    try:
        return SessionStatus(value.upper()).value
    except ValueError:
        known = ", ".join(s.value for s in SessionStatus)
        fail(f"--state {value!r} is not a session state; use one of {known}")
