"""`corral run [options] -- CMD ...`: submit a batch session, follow it, exit with its code."""

from __future__ import annotations

import os
import re
import sys
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

import typer

from corral.cli._common import fail
from corral.cli._follow import SessionFollower, Terminal, confirm_on_terminal
from corral.cli._remote import call
from corral.client import Client, UnreachableError, UploadError, ValidationError, validate_spec
from corral.domain.field_errors import FieldError, describe
from corral.domain.slots import SlotError, parse_amount
from corral.domain.spec import ClusterMode, SessionSpec, SessionType

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
}

# A lone argument with these is a shell script, not a program name.
_SHELL_SYNTAX = re.compile(r"[\s|&;<>()$`*?]")


def default_image(command: list[str]) -> str:
    """`shell` for one argument that is a shell script, else `python` (which runs any argv)."""
    if len(command) == 1 and _SHELL_SYNTAX.search(command[0]):
        return "shell"
    return "python"


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
        bool, typer.Option("--detach", "-d", help="Print the session id and return at once.")
    ] = False,
    follow: Annotated[
        bool,
        typer.Option(
            "--follow/--no-follow", help="Stream the command's output (else only wait for the end)."
        ),
    ] = True,
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
    """
    spec = _spec(
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
        env=_environment(env or []),
        workdir=None if upload else os.path.abspath(workdir) if workdir else os.getcwd(),
    )
    if upload is not None and workdir is not None:
        fail("give --workdir or --upload, not both: an upload's command starts in its copy")

    async def submit(client: Client) -> int:
        chosen = spec
        if upload is not None:
            chosen = spec.model_copy(update={"upload": await _upload(client, upload)})
        session = await client.create_session(chosen)
        if detach:
            typer.echo(str(session.id))
            return 0
        terminal = Terminal(
            stdout=sys.stdout.buffer,
            stderr=sys.stderr.buffer,
            say=_say,
            confirm=confirm_on_terminal,
        )
        try:
            return await SessionFollower(client, session, terminal, stream_logs=follow).run()
        except UnreachableError as exc:
            raise UnreachableError(
                f"{exc}; session {session.id} may still be running: "
                f"`corral session info {session.id}`"
            ) from exc

    raise typer.Exit(call(submit))


async def _upload(client: Client, directory: Path) -> str:
    """Send `directory` unless the server has it; its digest."""
    try:
        sent = await client.upload_directory(directory)
    except UploadError as exc:
        fail(str(exc))
    if sent.sent:
        _say(f"uploaded {directory} ({sent.size_bytes} bytes, sha256 {sent.digest[:12]})")
    else:
        _say(f"{directory} is unchanged since its upload, nothing sent (sha256 {sent.digest[:12]})")
    return sent.digest


def _spec(**fields: Any) -> SessionSpec:
    # A fresh creation_id makes the submission safe to retry: the server creates one session.
    fields = {"type": SessionType.BATCH, "creation_id": uuid.uuid4().hex, **fields}
    try:
        return validate_spec(fields)
    except ValidationError as exc:
        fail(describe(FieldError(_FLAGS.get(e.field, e.field), e.message) for e in exc.errors))


def _amount(flag: str, slot: str, text: str) -> Decimal:
    try:
        return parse_amount(slot, text)
    except SlotError as exc:
        fail(f"{flag} {text}: {exc.problem}")


def _environment(items: list[str]) -> dict[str, str]:
    variables: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--env {item!r}: expected KEY=VALUE")
        variables[key] = value
    return variables


def _say(line: str) -> None:
    typer.echo(f"corral: {line}", err=True)
