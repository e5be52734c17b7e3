"""The process runtime's kernel record: written and read back whole, refused when unusable, and
a process recognised by pid and start time together."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from corral.agent.runtime import LogMark
from corral.agent.runtime._cgroups import Cgroup
from corral.agent.runtime._kernel_record import (
    EXIT_FILE,
    RECORD_FILE,
    KernelRecord,
    ProcessIdentity,
    RecordError,
    running_since,
)
from corral.domain.types import KernelId

KID = KernelId(uuid.UUID(int=7))


def record(work_dir: Path) -> KernelRecord:
    """A record with every field set."""
    return KernelRecord(
        kernel_id=KID,
        work_dir=work_dir,
        wrapper=ProcessIdentity(100, 5000),
        kernel=ProcessIdentity(101, None),
        devices=(0, 2),
        cgroups=(Cgroup(2, Path("/sys/fs/cgroup/a/corral-k"), frozenset({"cpu", "memory"})),),
        logs={"stdout": work_dir / "stdout.log", "stderr": work_dir / "stderr.log"},
        log_marks={"stdout": LogMark(10, 25), "stderr": LogMark(3, 3)},
        restart=2,
    )


def test_a_written_record_reads_back_equal(tmp_path: Path) -> None:
    """Every field survives the file, which is replaced whole (no temporary file left)."""
    written = record(tmp_path)
    written.write()
    assert KernelRecord.read(tmp_path / RECORD_FILE) == written
    again = written.with_log_marks({"stdout": LogMark(25, 25)})
    again.write()
    assert KernelRecord.read(tmp_path / RECORD_FILE) == again
    assert [p.name for p in tmp_path.iterdir()] == [RECORD_FILE]


def test_a_record_from_before_restarts_reads_as_the_first_start(tmp_path: Path) -> None:
    """A record an older agent wrote (no `restart` key) is the kernel's first start."""
    written = record(tmp_path)
    data = written.to_json()
    del data["restart"]
    (tmp_path / RECORD_FILE).write_text(json.dumps(data))
    assert KernelRecord.read(tmp_path / RECORD_FILE).restart == 0


@pytest.mark.parametrize(
    "text",
    ["{not json", "[]", json.dumps({"version": 2}), json.dumps({"version": 1, "kernel_id": "x"})],
)
def test_an_unusable_record_is_refused_with_its_path(tmp_path: Path, text: str) -> None:
    """Not JSON, another version, a field missing or malformed: RecordError naming the file."""
    path = tmp_path / RECORD_FILE
    path.write_text(text)
    with pytest.raises(RecordError, match=RECORD_FILE):
        KernelRecord.read(path)


def test_the_exit_status_is_read_when_there_is_one(tmp_path: Path) -> None:
    """No exit file: None; an integer: it; anything else: RecordError."""
    kernel = record(tmp_path)
    assert kernel.exit_code() is None
    (tmp_path / EXIT_FILE).write_text('{"exit_code": -9}')
    assert kernel.exit_code() == -9
    for bad in ('{"exit_code": true}', '{"code": 1}', "oops"):
        (tmp_path / EXIT_FILE).write_text(bad)
        with pytest.raises(RecordError):
            kernel.exit_code()
    kernel.remove()
    kernel.remove()  # nothing left: fine
    assert list(tmp_path.iterdir()) == []


def test_a_process_is_recognised_by_its_pid_and_start_time_together() -> None:
    """This process matches itself; the same pid with another start time, or none, does not."""
    started = running_since(os.getpid())
    assert started is not None
    assert ProcessIdentity(os.getpid(), started).alive()
    assert not ProcessIdentity(os.getpid(), started + 1).alive()
    assert not ProcessIdentity(os.getpid(), None).alive()
    assert running_since(2**22 + 1) is None  # above the kernel's pid limit: never a process
