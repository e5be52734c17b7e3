"""Submitting a job array from the CLI (`corral run --array`, `corral submit`), and waiting
for all of its elements to end (`--wait`)."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Callable

import typer

from corral.cli._follow import exit_code_of
from corral.client import Client
from corral.domain.arrays import ArraySpec
from corral.domain.refs import element_ref

WAIT_POLL_S = 2.0  # how often `--wait` reads the array's elements again
_PAGE = 1000


async def submit_array(
    client: Client, spec: ArraySpec, *, wait: bool, say: Callable[[str], None]
) -> int:
    """Submit the array and print its number (stdout); with `wait`, return once every element
    has ended with the highest exit code among them (Slurm's `sbatch --wait`), else 0."""
    array = await client.create_array(spec)
    throttle = f", at most {array.throttle} at once" if array.throttle else ""
    typer.echo(str(array.number))  # alone on stdout, for scripts: N=$(corral run --array ...)
    first = array.elements[0].index
    say(
        f"array {array.number}: {array.count} sessions{throttle}; "
        f"element {first} is {element_ref(array.number, first)}"
    )
    if not wait:
        say(f"see it with `corral session info {array.number}`")
        return 0
    return await wait_for_array(client, array.id, array.number, say)


async def wait_for_array(
    client: Client, array_id: uuid.UUID, number: int, say: Callable[[str], None]
) -> int:
    """Poll the array's elements until all have ended; the highest of their exit codes."""
    shown = ""
    while True:
        elements = [s async for s in client.iter_sessions(array_id=array_id, page_size=_PAGE)]
        counts = Counter(s.status.value for s in elements)
        line = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
        if line != shown:
            say(f"array {number}: {line}")
            shown = line
        if elements and all(s.is_terminal for s in elements):
            return max(exit_code_of(s) for s in elements)
        await asyncio.sleep(WAIT_POLL_S)
