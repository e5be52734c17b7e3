"""What the commands that talk to a manager share: the client, running a call, tables, JSON.

Light to import: the SDK's client and models, asyncio and rich are loaded when used, so a
command that needs none of them (`session ls`, over `_plain`) starts without them.
"""

from __future__ import annotations

import json
import sys
import unicodedata
from collections.abc import Callable, Coroutine, Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from corral.cli._common import INTERRUPTED_EXIT
from corral.cli._plain import failed
from corral.client.config import ClientConfigError
from corral.client.errors import CorralError
from corral.domain.refs import REF_NAMES_ARRAY

if TYPE_CHECKING:
    from corral.client import Client

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


def names_array(exc: CorralError) -> bool:
    """Whether the API refused a reference because it names a whole job array."""
    return exc.kind == REF_NAMES_ARRAY


def connect() -> Client:
    """The SDK client of the configured server (tests replace this to inject a transport)."""
    from corral.client import Client

    return Client.from_config()


def call(work: Callable[[Client], Coroutine[Any, Any, T]]) -> T:
    """Run `work` with a client; errors exit with `corral: error: ...` (2: usage, 1: others).

    Invalid input (a bad flag value the server refused, no configured server, a session
    reference that fits several sessions or names a whole job array) exits 2, like any usage
    error; anything else the API or the network says exits 1; Ctrl-C exits 130.
    """

    import asyncio
    import signal

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
    except (ClientConfigError, CorralError) as exc:
        failed(exc)


def print_json(value: object) -> None:
    """Print `value` (API models included) as indented JSON."""
    typer.echo(json.dumps(jsonable(value), indent=2))


def print_json_line(value: object) -> None:
    """Print `value` as one line of JSON (for streams: one record per line)."""
    typer.echo(json.dumps(jsonable(value), separators=(",", ":")))


def jsonable(value: object) -> Any:
    """`value` as plain JSON values: models dumped, sequences of them too."""
    pydantic = sys.modules.get("pydantic")  # no model without it: not imported for one
    if pydantic is not None and isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    return value


def print_table(headers: Sequence[str] | None, rows: Iterable[Sequence[str]]) -> None:
    """Print rows as aligned columns, two spaces apart (bold headers on a terminal, never
    wrapped or cut: a cut id is useless to copy or to `awk`), every cell as written."""
    lines = [list(headers)] if headers is not None else []
    lines += [[str(cell) for cell in row] for row in rows]
    count = max((len(line) for line in lines), default=0)
    for line in lines:
        line += [""] * (count - len(line))
    widths = [max(_width(line[i]) for line in lines) for i in range(count)]
    bold = headers is not None and sys.stdout.isatty()
    for n, line in enumerate(lines):
        text = "  ".join(c + " " * (w - _width(c)) for c, w in zip(line, widths, strict=True))
        text = text.rstrip()
        typer.echo(f"\033[1m{text}\033[0m" if bold and n == 0 else text)


def _width(text: str) -> int:
    """The columns `text` takes on a terminal: two for a wide character (CJK), none for a
    combining one."""
    if text.isascii():
        return len(text)
    return sum(
        0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
        for c in text
    )


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
