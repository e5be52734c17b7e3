"""`corral session outputs ID`: the files a session's kernels wrote to CORRAL_OUTPUT_DIR."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from corral.cli._common import fail
from corral.cli._remote import JsonOption, SessionArgument, call, print_json, print_table

if TYPE_CHECKING:
    from corral.client import Client, OutputFile

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def outputs_command(
    session: SessionArgument,
    dest: Annotated[
        Path | None,
        typer.Option(help="Where to put them (default: ./<SESSION>-outputs)."),
    ] = None,
    list_only: Annotated[
        bool, typer.Option("--list", help="List them (kernel, name, size) instead.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Download a session's output files (one folder per kernel when it has several)."""
    if list_only or as_json:
        files = call(lambda client: _listed(client, session))
        if as_json:
            print_json(files)
        elif not files:
            typer.echo(f"session {session} has no output files", err=True)
        else:
            print_table(
                ["KERNEL", "NAME", "SIZE"],
                [[str(f.kernel), f.name, str(f.size_bytes)] for f in files],
            )
        return
    target = dest or Path(f"{_UNSAFE.sub('_', session)}-outputs")

    async def fetch(client: Client) -> bytes:
        return await client.download_outputs(await client.resolve_session_id(session))

    archive = call(fetch)
    try:
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
            members = tar.getmembers()
            tar.extractall(target, filter="data")  # names from the server, checked all the same
    except (OSError, tarfile.TarError) as exc:
        fail(f"cannot write the outputs into {target}: {exc}", code=1)
    if not members:
        typer.echo(f"session {session} has no output files", err=True)
        return
    size = sum(m.size for m in members)
    typer.echo(f"{len(members)} file(s), {size} bytes, in {target}", err=True)


async def _listed(client: Client, session: str) -> list[OutputFile]:
    return await client.list_outputs(await client.resolve_session_id(session))
