"""What a later agent needs to find a `process` kernel again: its record and its exit file.

Both live in the kernel's work directory. The record (RECORD_FILE) is written when the kernel
starts and again as its logs are shipped, always to a temporary file renamed into place, so a
reader sees a whole record or none. The exit-status wrapper (`_exitwrap.py`) writes EXIT_FILE when
the kernel ends, in one write; it is read only once the wrapper is gone, so whole by then. A pid
alone proves nothing after a restart: the kernel may have ended and the pid gone to another
process. So each process is recorded with its start time (/proc/<pid>/stat field 22, clock ticks
after boot), and a process counts as the recorded one only while both match.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Mapping
from dataclasses import field, replace
from pathlib import Path
from typing import Any

from corral.agent.runtime import LOG_STREAMS, LogMark
from corral.agent.runtime._cgroups import Cgroup
from corral.domain.record import record
from corral.domain.types import KernelId

RECORD_FILE = ".corral-kernel.json"
EXIT_FILE = ".corral-exit.json"
RECORD_VERSION = 1
_STAT_START_FIELD = 19  # field 22 of /proc/<pid>/stat, counted after the ")" ending field 2
_STAT_STATE_FIELD = 0  # field 3
_GONE_STATES = frozenset({"Z", "X"})  # a zombie has ended; only its exit status is left


class RecordError(ValueError):
    """A kernel record cannot be read (not JSON, a field missing or of the wrong type)."""


def running_since(pid: int) -> int | None:
    """When the live process `pid` started (clock ticks after boot); None if none runs."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat.rsplit(b")", 1)[1].split()
    if fields[_STAT_STATE_FIELD].decode() in _GONE_STATES:
        return None
    return int(fields[_STAT_START_FIELD])


@record
class ProcessIdentity:
    """A process as a later agent recognises it: its pid and when it started."""

    pid: int
    start_ticks: int | None  # None: unknown, so never taken for the recorded process

    def alive(self) -> bool:
        """Whether this very process still runs (not a stranger that got its pid)."""
        return self.start_ticks is not None and running_since(self.pid) == self.start_ticks


@record
class KernelRecord:
    """A started kernel as the `process` runtime records it (a `LeftKernel` when read back)."""

    kernel_id: KernelId
    work_dir: Path
    wrapper: ProcessIdentity  # the exit-status wrapper, the agent's child
    kernel: ProcessIdentity  # the kernel leads its process group: its pid is the group id
    devices: tuple[int, ...] = ()
    cgroups: tuple[Cgroup, ...] = ()
    logs: Mapping[str, Path] = field(default_factory=dict)  # stream: file
    log_marks: Mapping[str, LogMark] = field(default_factory=dict)
    cwd: Path | None = None  # where the kernel started (None: recorded before it was kept)
    port: int | None = None  # the port a serving replica was given ($CORRAL_PORT)
    # Which start of the kernel this is (`KernelLaunch.restart`): an adopting agent goes on
    # counting restarts from here, and never starts this one again.
    restart: int = 0

    @property
    def path(self) -> Path:
        """The record's file."""
        return self.work_dir / RECORD_FILE

    @property
    def exit_file(self) -> Path:
        """Where the wrapper leaves the kernel's exit status."""
        return self.work_dir / EXIT_FILE

    def with_log_marks(self, marks: Mapping[str, LogMark]) -> KernelRecord:
        """The same record with other log marks."""
        return replace(self, log_marks=dict(marks))

    def write(self) -> None:
        """Replace the record's file with this record, atomically."""
        temporary = self.path.with_name(f"{RECORD_FILE}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(self.to_json()))
        os.replace(temporary, self.path)

    def remove(self) -> None:
        """Forget the kernel: remove its record and exit files (missing ones are fine)."""
        for path in (self.path, self.exit_file):
            path.unlink(missing_ok=True)

    def exit_code(self) -> int | None:
        """The kernel's exit status as the wrapper recorded it; None when there is none."""
        try:
            code = json.loads(self.exit_file.read_text())["exit_code"]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise RecordError(f"{self.exit_file}: unreadable exit status ({exc})") from exc
        if not isinstance(code, int) or isinstance(code, bool):
            raise RecordError(f"{self.exit_file}: exit_code {code!r} is not an integer")
        return code

    def to_json(self) -> dict[str, Any]:
        """The record as the file holds it."""
        return {
            "version": RECORD_VERSION,
            "kernel_id": str(self.kernel_id),
            "work_dir": str(self.work_dir),
            "wrapper": _identity_json(self.wrapper),
            "kernel": _identity_json(self.kernel),
            "devices": list(self.devices),
            "cgroups": [
                {"version": c.version, "path": str(c.path), "controllers": sorted(c.controllers)}
                for c in self.cgroups
            ],
            "logs": {stream: str(path) for stream, path in self.logs.items()},
            "log_marks": {s: [m.shipped, m.sending] for s, m in self.log_marks.items()},
            "cwd": None if self.cwd is None else str(self.cwd),
            "port": self.port,
            "restart": self.restart,
        }

    @classmethod
    def read(cls, path: Path) -> KernelRecord:
        """The record in `path` (RecordError when it cannot be used)."""
        try:
            data = json.loads(path.read_text())
            if data.get("version") != RECORD_VERSION:
                raise RecordError(f"{path}: record version {data.get('version')!r} is not known")
            return cls(
                kernel_id=KernelId(uuid.UUID(data["kernel_id"])),
                work_dir=Path(data["work_dir"]),
                wrapper=_identity(data["wrapper"]),
                kernel=_identity(data["kernel"]),
                devices=tuple(int(d) for d in data["devices"]),
                cgroups=tuple(
                    Cgroup(int(c["version"]), Path(c["path"]), frozenset(c["controllers"]))
                    for c in data["cgroups"]
                ),
                logs={s: Path(data["logs"][s]) for s in LOG_STREAMS if s in data["logs"]},
                log_marks={
                    s: LogMark(int(shipped), int(sending))
                    for s, (shipped, sending) in data["log_marks"].items()
                    if s in LOG_STREAMS
                },
                cwd=Path(data["cwd"]) if data.get("cwd") else None,
                port=int(data["port"]) if data.get("port") is not None else None,
                restart=int(data.get("restart") or 0),
            )
        except RecordError:
            raise
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise RecordError(f"{path}: not a usable kernel record ({exc!r})") from exc


def _identity_json(identity: ProcessIdentity) -> dict[str, int | None]:
    return {"pid": identity.pid, "start_ticks": identity.start_ticks}


def _identity(data: Mapping[str, Any]) -> ProcessIdentity:
    start = data["start_ticks"]
    return ProcessIdentity(int(data["pid"]), None if start is None else int(start))
