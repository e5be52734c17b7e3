"""A simulated agent's own record of the kernels it started and how each ended (append-only).

`corral agent --runtime simulated` writes one JSON line per event to `JOURNAL_NAME` in its data
dir, so a harness (`corral chaos`) can check from the agents' side what the database claims: no
kernel started twice for one placement, no agent running more than its capacity. Each line is
one `write` to a file opened for appending, so a SIGKILLed agent leaves whole lines behind.

It is also the simulated runtime's record for adoption, as the process runtime's records in
the kernels' work directories are: the next agent finds here (`left_kernels`) every kernel an
earlier one started and no agent has discarded yet. One never ended was running when its agent
died, and died with it: it is reported lost. One that ended is reported with its exit (the
earlier agent may have died before the manager heard it). Either way it is never started again
for the same placement; once discarded (the manager no longer assigns it) it is marked forgotten.
"""

from __future__ import annotations

import enum
import json
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

JOURNAL_NAME = "simulated-kernels.jsonl"


class JournalEvent(enum.StrEnum):
    """What a journal line records."""

    BOOT = "boot"  # the agent process started: every kernel of an earlier boot is gone
    START = "start"  # a kernel started (the runtime's start succeeded)
    END = "end"  # a kernel ended: `how` says by itself (exited) or stopped (terminated)
    FORGOTTEN = "forgotten"  # a later agent discarded the kernel: no agent looks at it again


class EndHow(enum.StrEnum):
    """How a simulated kernel ended."""

    EXITED = "exited"  # its run time elapsed: it ran to its end
    TERMINATED = "terminated"  # the agent stopped it
    LOST = "lost"  # it died with its agent: the next agent found it started and never ended


class Journal:
    """Appends events to one file (a line each, written at once)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, event: JournalEvent, **fields: Any) -> None:
        """One line: the event, the wall-clock time, and `fields`."""
        line = json.dumps({"event": event.value, "t": time.time(), **fields}) + "\n"
        os.write(self._fd, line.encode())

    def close(self) -> None:
        """Close the file (lines already written stay)."""
        os.close(self._fd)


def read_journal(path: Path) -> Iterator[Mapping[str, Any]]:
    """The journal's events in order; a torn last line (a kill mid-write) is skipped."""
    if not path.exists():
        return
    with path.open() as lines:
        for line in lines:
            try:
                yield json.loads(line)
            except ValueError:
                continue


@dataclass
class LeftEntry:
    """What the journal says of a kernel an earlier agent started and no agent discarded."""

    attempt: int  # the placement it started under
    restart: int = 0  # which start of the kernel under it (0: the first; n: its n-th restart)
    ended: Mapping[str, Any] | None = None  # its END line, if it ended


def left_kernels(path: Path) -> dict[str, LeftEntry]:
    """The kernels started and not discarded (kernel id -> what the journal says of it)."""
    left: dict[str, LeftEntry] = {}
    for line in read_journal(path):
        event, kernel = line.get("event"), line.get("kernel")
        if kernel is None:
            continue
        if event == JournalEvent.START:
            left[str(kernel)] = LeftEntry(
                int(line.get("attempt", 0)), int(line.get("restart") or 0)
            )
        elif event == JournalEvent.END and str(kernel) in left:
            left[str(kernel)].ended = line
        elif event == JournalEvent.FORGOTTEN:
            left.pop(str(kernel), None)
    return left
