"""A `process` kernel as an agent holds it: one it started, or one it adopted after a restart.

Either way the kernel is a process group led by the kernel's first process, under the
exit-status wrapper (`_exitwrap.py`); its logs and outputs are files in its work directory. To
end it: SIGTERM to the group, the grace period, SIGKILL to the group. Once it ended, what is
left of the group is killed and its cgroups are removed (their OOM counter saying whether it was
`oom_killed`). The two differ in how they learn that it ended: `ProcessKernel` waits for the
wrapper, its child; an `AdoptedKernel`'s wrapper is some earlier agent's child, so it polls
whether the wrapper still runs and then reads the exit status the wrapper left. No status left
(the wrapper itself was killed) means the kernel is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from stat import S_ISREG
from typing import Any

from corral.agent.runtime import (
    KERNEL_LOST_CAUSE,
    LOG_STREAMS,
    KernelExit,
    KernelLaunch,
    LogMark,
    OutputFile,
)
from corral.agent.runtime._cgroups import release_cgroups
from corral.agent.runtime._children import Child
from corral.agent.runtime._kernel_record import KernelRecord, ProcessIdentity, RecordError
from corral.domain.failure_causes import FailureCause

logger = logging.getLogger(__name__)


class _HostKernel:
    """What both kinds share: files, signals, the end of a kernel; `_exit` is set by each."""

    _exit: asyncio.Task[KernelExit]

    def __init__(self, launch: KernelLaunch, record: KernelRecord, host: str) -> None:
        self._launch = launch
        self._record = record
        self._write_lock = threading.Lock()  # record writes run in threads; one at a time
        self._info: dict[str, Any] = {"host": host, "pid": record.kernel.pid}
        if record.port is not None:
            self._info["port"] = record.port  # where a serving replica listens
        if record.restart:
            self._info["restart"] = record.restart  # which restart of the kernel runs here
        if record.cwd is not None:
            self._info["cwd"] = str(record.cwd)  # users can tell whether it is their workdir
        if record.cgroups:
            self._info["cgroups"] = {
                controller: str(cgroup.path)
                for cgroup in record.cgroups
                for controller in sorted(cgroup.controllers)
            }

    @property
    def info(self) -> Mapping[str, Any]:
        """Host, the kernel's pid (its process group's id), where it started, its cgroups."""
        return self._info

    @property
    def log_marks(self) -> Mapping[str, LogMark]:
        """How far the logs were shipped, as last recorded."""
        return self._record.log_marks

    async def wait(self) -> KernelExit:
        """Until the kernel's main process ends; its leftover processes are killed then."""
        return await asyncio.shield(self._exit)

    async def terminate(self, grace_s: float) -> KernelExit:
        """SIGTERM the process group, SIGKILL it after `grace_s`; how it ended. Idempotent."""
        if not self._exit.done():
            self._signal_group(signal.SIGTERM)
            try:
                async with asyncio.timeout(grace_s):
                    await asyncio.shield(self._exit)
            except TimeoutError:
                extra = {"kernel_id": str(self._launch.kernel_id), "grace_s": grace_s}
                logger.warning("runtime.kernel_killed", extra=extra)
                self._signal_group(signal.SIGKILL)
        return await asyncio.shield(self._exit)

    async def read_log(self, stream: str, offset: int, limit: int) -> bytes:
        """Up to `limit` bytes of stdout.log or stderr.log from byte `offset` on."""
        if stream not in LOG_STREAMS:
            raise ValueError(f"unknown log stream {stream!r}; use one of {LOG_STREAMS}")
        path = self._record.logs.get(stream, self._launch.work_dir / f"{stream}.log")
        # On the event loop: a read of at most `limit` bytes (256 KiB from the worker) of a file
        # just written costs less than a hop to a thread and back, done twice a kernel at least.
        return _read_range(path, offset, limit)

    async def list_outputs(self) -> list[OutputFile]:
        """The regular files under the output directory, sorted by name (symlinks skipped)."""
        # Most kernels leave none: one look on the event loop (~0.01 ms) says so, where the
        # walk's hop to a thread and back costs ~0.15 ms of CPU. A walk may be long: a thread.
        if _empty_or_missing(self._launch.output_dir):
            return []
        return await asyncio.to_thread(_list_files, self._launch.output_dir)

    async def read_output(self, name: str) -> bytes:
        """One output file's content; a name leading out of the output directory is refused."""
        return await asyncio.to_thread(_read_inside, self._launch.output_dir, name)

    async def save_log_marks(self, marks: Mapping[str, LogMark]) -> None:
        """Write the marks into the kernel's record (a failure only costs an adopter resends)."""
        self._record = self._record.with_log_marks(marks)
        try:
            await asyncio.to_thread(self._write_record)
        except OSError as exc:
            extra = {"kernel_id": str(self._launch.kernel_id), "error": str(exc)}
            logger.warning("runtime.log_marks_unsaved", extra=extra)

    def detach(self) -> None:
        """Stop watching the kernel; it runs on, for a later agent to adopt."""
        self._exit.cancel()

    def _write_record(self) -> None:
        with self._write_lock:
            self._record.write()  # the latest marks, even when an older write was queued

    def _may_signal(self) -> bool:
        """Whether the kernel's process group id still names this kernel's group."""
        return True

    def _signal_group(self, sig: signal.Signals) -> None:
        # The kernel leads its own session, so its pid is the group id. Once it is reaped the id
        # stays reserved while any member lives; an empty group just reports ESRCH.
        if self._may_signal():
            signal_kernel(self._record.kernel, sig)

    async def _finish(self, code: int | None) -> KernelExit:
        """The kernel ended with `code` (None: lost): clean up after it, say how it ended."""
        self._signal_group(signal.SIGKILL)  # a kernel's orphans must not outlive it
        cgroups = [cgroup for cgroup in self._record.cgroups if cgroup.path.exists()]
        oom_killed = bool(cgroups) and await release_cgroups(cgroups)
        kernel_id = str(self._launch.kernel_id)
        if code is None:
            logger.warning("runtime.kernel_lost", extra={"kernel_id": kernel_id})
            message = (
                "the kernel's process is gone and left no exit status (its exit-status wrapper "
                "was killed, or the host restarted)"
            )
            return KernelExit(exit_code=None, failure_cause=KERNEL_LOST_CAUSE, message=message)
        cause = FailureCause.OOM_KILLED if oom_killed and code != 0 else None
        extra = {"kernel_id": kernel_id, "exit_code": code, "cause": cause}
        logger.info("runtime.kernel_exited", extra=extra)
        if cause is None:
            return KernelExit(exit_code=code)
        limit_bytes = self._launch.slots.get("mem", 0) // 1000
        message = f"the kernel used more than its memory limit ({limit_bytes} bytes)"
        return KernelExit(exit_code=code, failure_cause=cause, message=message)


class ProcessKernel(_HostKernel):
    """A kernel this agent started: the `process` runtime's RunningKernel."""

    def __init__(
        self,
        launch: KernelLaunch,
        wrapper: Child,
        record: KernelRecord,
        host: str,
    ) -> None:
        super().__init__(launch, record, host)
        self._wrapper = wrapper
        # Reaped and cleaned up as soon as it ends, whether or not anyone waits yet.
        self._exit = asyncio.create_task(self._reap(), name=f"kernel-{launch.kernel_id}")

    async def _reap(self) -> KernelExit:
        # The wrapper ends as its kernel did, so its status is the kernel's.
        return await self._finish(await self._wrapper.wait())


class AdoptedKernel(_HostKernel):
    """A kernel an earlier agent started and left, taken over through its record."""

    def __init__(
        self, launch: KernelLaunch, record: KernelRecord, host: str, poll_s: float
    ) -> None:
        super().__init__(launch, record, host)
        self._poll_s = poll_s
        self._seen_running = False
        self._exit = asyncio.create_task(self._watch(), name=f"kernel-{launch.kernel_id}")

    def _may_signal(self) -> bool:
        # While the wrapper runs it has not reaped the kernel, so the kernel's pid is not free;
        # a group whose end was seen a poll ago is still this kernel's (what is left of it).
        # One that ended while no agent watched may be empty, its id a stranger's by now.
        return self._seen_running or self._record.wrapper.alive() or self._record.kernel.alive()

    async def _watch(self) -> KernelExit:
        while await asyncio.to_thread(self._record.wrapper.alive):
            self._seen_running = True
            await asyncio.sleep(self._poll_s)
        try:
            code = await asyncio.to_thread(self._record.exit_code)
        except RecordError as exc:
            extra = {"kernel_id": str(self._launch.kernel_id), "error": str(exc)}
            logger.warning("runtime.exit_status_unreadable", extra=extra)
            code = None
        # Without a status the wrapper was killed: a kernel still running would have nobody to
        # tell its end, so it ends now with the rest of its group.
        return await self._finish(code)


def _read_range(path: Path, offset: int, limit: int) -> bytes:
    try:
        with path.open("rb") as file:
            file.seek(offset)
            return file.read(limit)
    except FileNotFoundError:
        return b""


def _empty_or_missing(directory: Path) -> bool:
    """Whether `directory` holds nothing (or is not there, or not a directory)."""
    try:
        with os.scandir(directory) as entries:
            return next(entries, None) is None
    except (FileNotFoundError, NotADirectoryError):
        return True


def _kernel_uid(root: Path) -> int | None:
    """The uid of a kernel run as another user (its outputs directory is theirs), else None."""
    owner = root.stat().st_uid
    return owner if owner != os.geteuid() else None


def _list_files(root: Path) -> list[OutputFile]:
    if not root.is_dir():
        return []
    kernel_uid = _kernel_uid(root)
    files = []
    for folder, _, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            stat = path.lstat()
            # Regular files only; of a kernel run as another user, only its own (a file it
            # linked in from elsewhere is not its output: see _read_inside).
            if S_ISREG(stat.st_mode) and kernel_uid in (None, stat.st_uid):
                files.append(OutputFile(path.relative_to(root).as_posix(), stat.st_size))
    return sorted(files, key=lambda output: output.name)


def _read_inside(root: Path, name: str) -> bytes:
    base = root.resolve()
    path = (base / name).resolve()
    if path == base or not path.is_relative_to(base):
        raise ValueError(
            f"output name {name!r} leads outside the kernel's output directory; "
            "use a name from list_outputs()"
        )
    kernel_uid = _kernel_uid(base)
    # Opened without following a last link, then checked by what was opened: a kernel run as
    # another user that swaps in a link after the check above reads nothing of the agent's.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as file:
        stat = os.fstat(file.fileno())
        if not S_ISREG(stat.st_mode) or kernel_uid not in (None, stat.st_uid):
            raise ValueError(f"output {name!r} is not a file of the kernel's own")
        return file.read()


def signal_kernel(kernel: ProcessIdentity, sig: signal.Signals) -> None:
    """`sig` to the kernel's process group; to the kernel alone in the moment after its
    `started` line, before `setsid` made it a group's leader (ESRCH for its group then), while
    it is still the recorded process."""
    try:
        os.killpg(kernel.pid, sig)
    except ProcessLookupError:
        if kernel.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(kernel.pid, sig)
