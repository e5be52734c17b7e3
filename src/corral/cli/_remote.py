"""What the commands that talk to a manager share: the client, running a call, tables, JSON."""

from __future__ import annotations

import asyncio
import io
import json
import signal
import sys
from collections.abc import Callable, Coroutine, Iterable, Sequence
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

import typer
from pydantic import BaseModel

from corral.cli._common import FAILURE_EXIT, INTERRUPTED_EXIT, USAGE_EXIT, fail
from corral.client import Client, ClientConfigError, CorralError, ValidationError
from corral.domain.refs import REF_AMBIGUOUS, REF_NAMES_ARRAY

T = TypeVar("T")

JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
SessionArgument = Annotated[
    str,
    typer.Argument(
        metavar="SESSION",
        help="A session's number, its id, a unique prefix of one, or a unique name; 12_7 for "
        "element 7 of job array 12.",
    ),
]
# Problems that say the reference itself must be retyped: usage errors (exit 2).
_REF_PROBLEMS = frozenset({REF_AMBIGUOUS, REF_NAMES_ARRAY})


def names_array(exc: CorralError) -> bool:
    """Whether the API refused a reference because it names a whole job array."""
    return exc.kind == REF_NAMES_ARRAY


def connect() -> Client:
    """The SDK client of the configured server (tests replace this to inject a transport)."""
    return Client.from_config()


def call(work: Callable[[Client], Coroutine[Any, Any, T]]) -> T:
    """Run `work` with a client; errors exit with `corral: error: ...` (2: usage, 1: others).

    Invalid input (a bad flag value the server refused, no configured server, a session
    reference that fits several sessions or names a whole job array) exits 2, like any usage
    error; anything else the API or the network says exits 1; Ctrl-C exits 130.
    """

    async def main() -> T:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        interrupted = asyncio.Event()

        def interrupt() -> None:
            interrupted.set()
            task.cancel()

        # SIGINT stops the command even when it was started with SIGINT ignored: a shell
        # starts a script's background jobs so (a test suite run in the background too), and
        # Python then raises no KeyboardInterrupt, so `events -f` or `logs -f` ran on after
        # a Ctrl-C or a `kill -INT`. `corral run` and `corral up` handle SIGINT themselves.
        loop.add_signal_handler(signal.SIGINT, interrupt)
        try:
            async with connect() as client:
                return await work(client)
        except asyncio.CancelledError:
            if interrupted.is_set():
                raise KeyboardInterrupt from None
            raise
        finally:
            loop.remove_signal_handler(signal.SIGINT)

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        raise typer.Exit(INTERRUPTED_EXIT) from None
    except (ClientConfigError, ValidationError) as exc:
        fail(str(exc), code=USAGE_EXIT)
    except CorralError as exc:
        fail(str(exc), code=USAGE_EXIT if exc.kind in _REF_PROBLEMS else FAILURE_EXIT)


def print_json(value: object) -> None:
    """Print `value` (API models included) as indented JSON."""
    typer.echo(json.dumps(jsonable(value), indent=2))


def print_json_line(value: object) -> None:
    """Print `value` as one line of JSON (for streams: one record per line)."""
    typer.echo(json.dumps(jsonable(value), separators=(",", ":")))


def jsonable(value: object) -> Any:
    """`value` as plain JSON values: models dumped, sequences of them too."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    return value


def print_table(headers: Sequence[str] | None, rows: Iterable[Sequence[str]]) -> None:
    """Print rows as aligned columns (bold headers on a terminal, never wrapped or cut)."""
    # Imported here: rich costs a command that prints no table (`corral run`) tens of ms.
    from rich.console import Console
    from rich.table import Table

    rows = list(rows)
    table = Table(
        box=None,
        pad_edge=False,
        show_edge=False,
        show_header=headers is not None,
        header_style="bold",
    )
    for header in headers or [""] * max((len(row) for row in rows), default=0):
        table.add_column(header, no_wrap=True, overflow="ignore")
    for row in rows:
        table.add_row(*row)
    terminal = sys.stdout.isatty()
    buffer = io.StringIO()
    # As wide as the content: a cut or wrapped id is useless to copy or to `awk`.
    Console(file=buffer, width=100_000, force_terminal=terminal, no_color=not terminal).print(table)
    for line in buffer.getvalue().splitlines():
        typer.echo(line.rstrip())


def age(moment: datetime | None, now: datetime | None = None) -> str:
    """How long ago `moment` was, kubectl style: `42s`, `5m`, `3h`, `2d` (`-` for None)."""
    if moment is None:
        return "-"
    seconds = max(0, int(((now or datetime.now(UTC)) - moment).total_seconds()))
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def local_time(moment: datetime | None) -> str:
    """`moment` in local time to the second, e.g. `2030-01-01 09:00:00` (`-` for None)."""
    return "-" if moment is None else moment.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def text(value: object) -> str:
    """A cell: `-` for None or empty, else the value as text."""
    return "-" if value is None or value == "" else str(value)
