"""`corral run [options] -- CMD ...`: submit a batch session, follow it, exit with its code."""

from __future__ import annotations

import os
import sys
import uuid
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from corral.cli import _plain
from corral.cli._common import env_flags, fail
from corral.client.config import ClientConfigError
from corral.client.errors import CorralError, FieldError, ValidationError
from corral.domain.dependency_syntax import DependencySyntaxError, parse_after, parse_dependency
from corral.domain.field_errors import describe
from corral.domain.images import default_image
from corral.domain.outcome import DependencyKind
from corral.domain.restarts import MAX_RESTART_LIMIT
from corral.domain.retry.terms import MAX_RETRIES, BackoffStrategy, RetryEligibleCause
from corral.domain.session_kinds import ClusterMode, SessionType
from corral.domain.slots import SlotError, parse_amount
from corral.domain.time_limit import parse_time_limit

# What follows a session (the SDK's async client and its models) is imported when a session is
# followed: `corral run --detach` sends one plain request (`PlainCall`) and needs neither, nor
# pydantic nor asyncio, and starts in about half the time.
if TYPE_CHECKING:
    from corral.client import Client
    from corral.domain.spec import SessionSpec


SpecT = TypeVar("SpecT", bound="SessionSpec")

# Register with these: options end at CMD, so `corral run python -c ...` needs no `--`.
CONTEXT_SETTINGS: dict[str, Any] = {"allow_interspersed_args": False}

# The flag that sets each field of the spec, to name it in an error.
_FLAGS = {
    "name": "--name",
    "image": "--image",
    "env": "--env",
    "resources.cpu": "--cpu",
    "resources.mem": "--mem",
    "resources.cuda.device": "--gpus",
    "resources": "--cpu/--mem/--gpus",
    "cluster_size": "--cluster-size",
    "resource_group": "--resource-group",
    "priority": "--priority",
    "array": "--array",
    "retry_policy.max_retries": "--retries",
    "retry_policy.retry_delay": "--retry-delay",
    "retry_policy.max_retry_delay": "--max-retry-delay",
    "retry_policy": "--retries",
}


def run_command(
    command: Annotated[
        list[str],
        typer.Argument(
            metavar="CMD", help="The program and its arguments (after `--`).", show_default=False
        ),
    ],
    cpu: Annotated[
        str, typer.Option(help="CPU cores per kernel: 2, 0.5 or 500m (milli-cores).")
    ] = "1",
    mem: Annotated[
        str,
        typer.Option(help="Memory per kernel: 4Gi (4·2³⁰ bytes), 4G (4·10⁹), 4g (= 4Gi)."),
    ] = "1g",
    gpus: Annotated[int, typer.Option(min=0, help="GPUs per kernel.")] = 0,
    cluster_size: Annotated[int, typer.Option(min=1, help="How many kernels to run.")] = 1,
    multi_node: Annotated[
        bool,
        typer.Option("--multi-node", help="Let the kernels spread over agents (default: one)."),
    ] = False,
    image: Annotated[
        str | None,
        typer.Option(help="`python`, `shell`, or an image the agents know (default: see above)."),
    ] = None,
    name: Annotated[str | None, typer.Option(help="A name to find the session by.")] = None,
    resource_group: Annotated[str, typer.Option(help="Where to run it.")] = "default",
    priority: Annotated[int, typer.Option(help="-100 to 100; higher runs first.")] = 0,
    env: Annotated[
        list[str] | None,
        typer.Option("--env", "-e", help="KEY=VALUE in the command's environment (repeatable)."),
    ] = None,
    after: Annotated[
        list[str] | None,
        typer.Option(
            "--after",
            metavar="REF[,REF…]",
            help="Start after these sessions succeeded; `afterany:REF` after they ended at "
            "all, `afternotok:REF` after they failed (repeatable).",
        ),
    ] = None,
    dependency: Annotated[
        list[str] | None,
        typer.Option(
            "--dependency",
            metavar="KIND:REF[:REF…][,…]",
            help="Slurm's form: afterok:12:13,afterany:14 (kinds afterok, afterany, afternotok).",
        ),
    ] = None,
    time: Annotated[
        str | None,
        typer.Option(
            "--time",
            "-t",
            metavar="LIMIT",
            help="Wall-time limit once it runs: 30s, 90m, 2h, 1d, or Slurm's MM, MM:SS, "
            "HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (default: the resource group's).",
        ),
    ] = None,
    workdir: Annotated[
        str | None,
        typer.Option(
            help="Where the command starts on the agent (default: this directory; the kernel's "
            "own directory where it does not exist there)."
        ),
    ] = None,
    upload: Annotated[
        Path | None,
        typer.Option(
            help="Send this directory (without .git and what its .corralignore lists); the "
            "command starts in its copy on the agent. An unchanged directory is sent once."
        ),
    ] = None,
    detach: Annotated[
        bool,
        typer.Option("--detach", "-d", help="Print the session's number and return at once."),
    ] = False,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow/--no-follow", help="Stream the command's output (else only wait for the end)."
        ),
    ] = True,
    array: Annotated[
        str | None,
        typer.Option(
            help="A job array: one session per index, Slurm's syntax (0-99, 1,3,5, 0-15:4; "
            "%N: at most N at once, 0-999%50). Prints the array's number and returns.",
            show_default=False,
        ),
    ] = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="With --array: wait for every element to end; exit with the highest exit code.",
        ),
    ] = False,
    restart_limit: Annotated[
        int,
        typer.Option(
            min=0,
            max=MAX_RESTART_LIMIT,
            help="Start a kernel that exits non-zero again on its agent, up to this many "
            "times (the session keeps running meanwhile); past it the session fails as "
            "without. 0: never.",
        ),
    ] = 0,
    retries: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=MAX_RETRIES,
            help="Run it again this many times at most if it fails (default: the resource "
            "group's or the cluster's policy, else 0). The output of every attempt is shown; "
            "the exit code is the last attempt's.",
            show_default=False,
        ),
    ] = None,
    retry_delay: Annotated[
        str | None,
        typer.Option(
            metavar="DELAY",
            help="Wait this long before the first retry: 30s, 10m, 1h, or seconds (default 60s).",
            show_default=False,
        ),
    ] = None,
    backoff: Annotated[
        BackoffStrategy | None,
        typer.Option(help="fixed: every retry waits DELAY; exponential: doubles it each time."),
    ] = None,
    max_retry_delay: Annotated[
        str | None,
        typer.Option(
            metavar="DELAY", help="The longest wait between attempts (default 1h; at most 24h)."
        ),
    ] = None,
    retry_on: Annotated[
        str | None,
        typer.Option(
            metavar="CAUSE[,CAUSE…]",
            help="Retry only failures of these causes: "
            + ", ".join(c.value for c in RetryEligibleCause)
            + " (default: all of them).",
        ),
    ] = None,
) -> None:
    """Run CMD as a batch session: show its phase, stream its output, exit with its exit code.

    The command's stdout and stderr reach yours untouched; corral's own progress goes to
    stderr, so `corral run -- python -c "print(42)" > out.txt` leaves exactly 42 in out.txt.
    The output shown is the main kernel's (`corral session logs --kernel N` shows the others).
    The exit code is the command's; without one, 0 when the session succeeded, else 1.
    Ctrl-C asks whether to terminate the session (terminates it when stdin is not a terminal);
    a second Ctrl-C answers yes.

    Images of the process runtime: `python` runs CMD as an argv, `python` or `python3` as the
    agent's interpreter and other programs from PATH; `shell` runs CMD with `/bin/sh -c`. The
    default is `shell` when CMD is one argument with spaces or shell syntax
    (`corral run 'make && ./bench | tee log'`), else `python`. `python` is the interpreter the
    agent is configured with for jobs (`corral agent --python`), by default the host's python3.

    CMD starts in the directory `corral run` was called from (or `--workdir`), when that
    directory exists on the agent: a shared file system, or `corral up` on this machine.
    Without one, `--upload DIR` sends DIR (a tar.gz, up to the manager's upload_max_bytes),
    and CMD starts in its copy on the agent.

    With `--array`, one session per index, submitted in one request; the array's number (12)
    goes to stdout and the command returns (`--wait`: once every element has ended). Each
    element is 12_INDEX to every command, with CORRAL_ARRAY_ID (12) and CORRAL_ARRAY_INDEX in
    its environment; 12 names the whole array (`session info`, `terminate`, `rm`, `--after`).

    Dependencies (`--after`, `--dependency`) name sessions by number, id, unique id prefix or
    name, 12_7 for an array's element, or 12 for every element of job array 12: a session
    that can never start after them (afterok after a failure) is cancelled, saying why.
    """
    try:
        wanted = parse_after(after or []) + parse_dependency(dependency or [])
    except DependencySyntaxError as exc:
        fail(str(exc))
    try:
        time_limit_s = parse_time_limit(time) if time is not None else None
    except ValueError as exc:
        fail(f"--time: {exc}")
    fields: dict[str, Any] = dict(
        command=command,
        image=image or default_image(command),
        name=name,
        resources={
            "cpu": _amount("--cpu", "cpu", cpu),
            "mem": _amount("--mem", "mem", mem),
            **({"cuda.device": gpus} if gpus else {}),
        },
        cluster_size=cluster_size,
        cluster_mode=ClusterMode.MULTI_NODE if multi_node else ClusterMode.SINGLE_NODE,
        resource_group=resource_group,
        priority=priority,
        env=env_flags(env or []),
        time_limit_s=time_limit_s,
        **({"restart_limit": restart_limit} if restart_limit else {}),
        workdir=None if upload else os.path.abspath(workdir) if workdir else os.getcwd(),
    )
    policy = _retry_policy(retries, retry_delay, backoff, max_retry_delay, retry_on)
    if policy:
        fields["retry_policy"] = policy
    if upload is not None and workdir is not None:
        fail("give --workdir or --upload, not both: an upload's command starts in its copy")
    if array is None and wait:
        fail("--wait goes with --array (a single session is waited for unless --detach)")
    if detach and array is None and upload is None and not wanted:
        raise typer.Exit(_submit_plain(fields, cpu=cpu, mem=mem))
    raise typer.Exit(_submit_and_follow(fields, wanted, upload, array, wait, follow, detach))


def _submit_and_follow(
    fields: dict[str, Any],
    wanted: list[tuple[str, DependencyKind]],
    upload: Path | None,
    array: str | None,
    wait: bool,
    follow: bool,
    detach: bool,
) -> int:
    """Submit through the SDK (dependencies resolved, the upload sent first), then follow."""
    from corral.cli._arrays import submit_array
    from corral.cli._dependencies import resolve
    from corral.cli._follow import Terminal, confirm_on_terminal, follow_chain
    from corral.cli._remote import call
    from corral.client import UnreachableError
    from corral.domain.arrays import ArraySpec
    from corral.domain.spec import SessionSpec

    async def completed(client: Client, model: type[SpecT], checked: SpecT, **more: Any) -> SpecT:
        """`checked` with what needs the server: dependencies resolved, the upload sent."""
        if wanted:
            checked = _spec(model, **fields, **more, dependencies=await resolve(client, wanted))
        if upload is not None:
            checked = checked.model_copy(update={"upload": await _upload(client, upload)})
        return checked

    if array is not None:
        array_spec = _spec(ArraySpec, array=array, **fields)  # checked before anything is sent

        async def submit_all(client: Client) -> int:
            chosen = await completed(client, ArraySpec, array_spec, array=array)
            return await submit_array(client, chosen, wait=wait, say=_say)

        return call(submit_all)
    spec = _spec(SessionSpec, **fields)  # every field checked before anything is sent

    async def submit(client: Client) -> int:
        session = await client.create_session(await completed(client, SessionSpec, spec))
        if detach:
            typer.echo(str(session.number))
            return 0
        terminal = Terminal(
            stdout=sys.stdout.buffer,
            stderr=sys.stderr.buffer,
            say=_say,
            confirm=confirm_on_terminal,
        )
        try:
            return await follow_chain(client, session, terminal, stream_logs=follow)
        except UnreachableError as exc:
            raise UnreachableError(
                f"{exc}; session {session.number} may still be running: "
                f"`corral session info {session.number}`"
            ) from exc

    return call(submit)


def _submit_plain(fields: dict[str, Any], *, cpu: str, mem: str) -> int:
    """Submit with one plain request and print the session's number (`--detach`).

    The server checks the spec (the SDK's path checks it here first, with the models this path
    does not load); a field it refuses is named by its flag all the same. Only the fields given
    are sent, the amounts as written (`500m`, `4Gi`): parsed above only to refuse a bad one
    before anything is sent.
    """
    given = {name: value for name, value in fields.items() if value is not None}
    body: dict[str, Any] = {"type": SessionType.BATCH.value, "creation_id": uuid.uuid4().hex}
    body |= given | {
        "resources": {**fields["resources"], "cpu": cpu, "mem": mem},
        "cluster_mode": fields["cluster_mode"].value,
    }
    try:
        session = _plain.plain_call().json("POST", "/v1/sessions", body)
    except ValidationError as exc:
        fail(_flagged(exc))
    except (ClientConfigError, CorralError) as exc:  # as every command's call ends
        _plain.failed(exc)
    typer.echo(str(session["number"]))
    return 0


async def _upload(client: Client, directory: Path) -> str:
    """Send `directory` unless the server has it; its digest."""
    from corral.client import UploadError

    try:
        sent = await client.upload_directory(directory)
    except UploadError as exc:
        fail(str(exc))
    if sent.sent:
        _say(f"uploaded {directory} ({sent.size_bytes} bytes, sha256 {sent.digest[:12]})")
    else:
        _say(f"{directory} is unchanged since its upload, nothing sent (sha256 {sent.digest[:12]})")
    return sent.digest


def _retry_policy(
    retries: int | None,
    delay: str | None,
    backoff: BackoffStrategy | None,
    max_delay: str | None,
    retry_on: str | None,
) -> dict[str, Any]:
    """The retry policy's fields the flags give (none given: the group's or cluster's)."""
    policy: dict[str, Any] = {}
    if retries is not None:
        policy["max_retries"] = retries
    if delay is not None:
        policy["retry_delay"] = _seconds("--retry-delay", delay)
    if backoff is not None:
        policy["backoff"] = backoff.value
    if max_delay is not None:
        policy["max_retry_delay"] = _seconds("--max-retry-delay", max_delay)
    if retry_on is not None:
        causes = [c.strip() for c in retry_on.split(",") if c.strip()]
        known = {c.value for c in RetryEligibleCause}
        for cause in causes:
            if cause not in known:
                fail(f"--retry-on {cause!r}: not a retry cause; use {', '.join(sorted(known))}")
        policy["eligible_causes"] = causes
    return policy


def _seconds(flag: str, text: str) -> float:
    """A delay as written (30s, 10m, 1h, or a number of seconds) in seconds."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return float(parse_time_limit(text))
    except ValueError:
        fail(f"{flag} {text!r}: write a delay like 30s, 10m, 1h, or a number of seconds")


def _spec(model: type[SpecT], **fields: Any) -> SpecT:
    from corral.client import validated

    # A fresh creation_id makes the submission safe to retry: the server creates it once.
    fields = {"type": SessionType.BATCH, "creation_id": uuid.uuid4().hex, **fields}
    try:
        return validated(model, fields)
    except ValidationError as exc:
        fail(_flagged(exc))


def _flagged(exc: ValidationError) -> str:
    """The refused fields, each named by the flag that sets it."""
    return describe(FieldError(_FLAGS.get(e.field, e.field), e.message) for e in exc.errors)


def _amount(flag: str, slot: str, text: str) -> Decimal:
    try:
        return parse_amount(slot, text)
    except SlotError as exc:
        fail(f"{flag} {text}: {exc.problem}")


def _say(line: str) -> None:
    typer.echo(f"corral: {line}", err=True)
