"""`corral run [options] -- CMD ...`: submit a batch session, follow it, exit with its code."""

from __future__ import annotations

import re
import sys
import uuid
from typing import Annotated, Any

import typer

from corral.cli._common import fail
from corral.cli._follow import SessionFollower, Terminal, confirm_on_terminal
from corral.cli._remote import call
from corral.client import Client, UnreachableError, ValidationError, validate_spec
from corral.domain.spec import ClusterMode, SessionSpec, SessionType

# Register with these: options end at CMD, so `corral run python -c ...` needs no `--`.
CONTEXT_SETTINGS: dict[str, Any] = {"allow_interspersed_args": False}

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
    cpu: Annotated[str, typer.Option(help="CPU cores per kernel; fractions allowed (0.5).")] = "1",
    mem: Annotated[str, typer.Option(help="Memory per kernel, e.g. 512m, 4g.")] = "1g",
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
    (`corral run 'make && ./bench | tee log'`), else `python`.
    """
    spec = _spec(
        command=command,
        image=image or default_image(command),
        name=name,
        resources={"cpu": cpu, "mem": mem, **({"cuda.device": gpus} if gpus else {})},
        cluster_size=cluster_size,
        cluster_mode=ClusterMode.MULTI_NODE if multi_node else ClusterMode.SINGLE_NODE,
        resource_group=resource_group,
        priority=priority,
        env=_environment(env or []),
    )

    async def submit(client: Client) -> int:
        session = await client.create_session(spec)
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
            return await SessionFollower(client, session, terminal, stream_logs=follow).run()
        except UnreachableError as exc:
            raise UnreachableError(
                f"{exc}; session {session.number} may still be running: "
                f"`corral session info {session.number}`"
            ) from exc

    raise typer.Exit(call(submit))


def _spec(**fields: Any) -> SessionSpec:
    # A fresh creation_id makes the submission safe to retry: the server creates one session.
    fields = {"type": SessionType.BATCH, "creation_id": uuid.uuid4().hex, **fields}
    try:
        return validate_spec(fields)
    except ValidationError as exc:
        fail(str(exc))


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
