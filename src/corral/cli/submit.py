"""`corral submit JOB_FILE`: submit a session or a job array written as YAML or TOML."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Annotated

import typer

from corral.cli._arrays import submit_array
from corral.cli._common import fail
from corral.cli._dependencies import parse_after, resolve
from corral.cli._follow import SessionFollower, Terminal, confirm_on_terminal
from corral.cli._remote import call
from corral.client import Client, ValidationError, validated
from corral.client.job_files import JobFileError, job_schema, load_job_file
from corral.domain.arrays import ArraySpec
from corral.domain.spec import SessionSpec


def submit_command(
    job_file: Annotated[
        Path | None,
        typer.Argument(
            metavar="JOB_FILE", help="A .yaml, .yml or .toml job file.", show_default=False
        ),
    ] = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Wait for the session (every element of an array) to end; exit with its code.",
        ),
    ] = False,
    schema: Annotated[
        bool, typer.Option("--schema", help="Print the job file's JSON schema and exit.")
    ] = False,
) -> None:
    """Submit the session (or job array) a job file describes; print its number (`12`, an
    array's too) and return.

    A job file holds the fields of a session spec (`corral submit --schema` lists them:
    command, image, resources, cluster_size, resource_group, priority, env, dependencies, ...)
    and `array` (Slurm's syntax, like "0-99%5") for a job array. A mistake is reported with
    the file, line and field: `job.yaml:7: resources: ...`. With --wait the command waits for
    the end and exits with the exit code (an array's highest).
    """
    if schema:
        typer.echo(json.dumps(job_schema(), indent=2))
        return
    if job_file is None:
        fail("give a job file (or --schema to see what one may hold)")
    try:
        job = load_job_file(job_file)
    except JobFileError as exc:
        if len(exc.problems) == 1:
            fail(exc.problems[0])
        fail(f"{len(exc.problems)} mistakes:\n  " + "\n  ".join(exc.problems))
    fields = job.model_dump(mode="json", exclude_unset=True, exclude={"array", "after"})
    # A fresh creation_id makes the submission safe to retry: the server creates it once.
    fields.setdefault("creation_id", uuid.uuid4().hex)
    model: type[SessionSpec] = SessionSpec
    if job.array is not None:
        model, fields = ArraySpec, {**fields, "array": job.array}

    async def submit(client: Client) -> int:
        if job.after:
            # Numbers, names and elements as the API resolves them, added to `dependencies`.
            waits = await resolve(client, parse_after(job.after))
            fields["dependencies"] = [*fields.get("dependencies", []), *waits]
        try:
            spec = validated(model, fields)
        except ValidationError as exc:
            fail(f"{job_file.name}: {exc}")
        if isinstance(spec, ArraySpec):
            return await submit_array(client, spec, wait=wait, say=_say)
        session = await client.create_session(spec)
        typer.echo(str(session.number))
        if not wait:
            return 0
        terminal = Terminal(
            stdout=sys.stdout.buffer,
            stderr=sys.stderr.buffer,
            say=_say,
            confirm=confirm_on_terminal,
        )
        return await SessionFollower(client, session, terminal, stream_logs=False).run()

    raise typer.Exit(call(submit))


def _say(line: str) -> None:
    typer.echo(f"corral: {line}", err=True)
