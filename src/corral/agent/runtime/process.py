"""The `process` runtime: every kernel is a process group on the agent's host.

Images name environments this agent knows: `python` (the interpreter configured for user jobs,
by default the host's `python3`, never corral's own virtualenv: `_host_python.py`), `shell`
(`/bin/sh`) and configured extras (an interpreter path, or a venv directory: its `bin/python`,
with VIRTUAL_ENV set). How a kernel's command runs under an image:

- python-like images: the command is an argv. `python` or `python3` as argv[0] is the image's
  interpreter; any other name is looked up on PATH, where the image's bin directory comes first.
- `shell`: `/bin/sh -c <script>`; a one-element command is the script, several are shlex-joined.
- an empty command (interactive sessions) idles until the kernel is terminated.

Where a kernel starts: in its unpacked upload when the session names one; else in the
session's `workdir` when that directory exists on this host (a shared file system, as Slurm
assumes; always so under `corral up`); else in its own work directory, and then the first line
of its stderr says so. CORRAL_WORKDIR names the directory it started in.

The kernel's `mem` slot is enforced by a cgroup per kernel (v2, else v1) where this host lets
the agent make one, else by RLIMIT_AS (best effort, and not for kernels holding GPUs: CUDA
reserves far more address space than it uses). Its `cpu` slot becomes a CFS quota in a cgroup
the same way (`cpu.max` on v2, `cpu.cfs_quota_us` on v1) where the host allows, else it is not
enforced. The kernel's first process moves itself into the kernel's cgroups (one per v1
hierarchy) or limits itself before it execs the kernel's command (the exit-status wrapper's
kernel side does it), so nothing the kernel forks escapes the limits. `notes()` says what this
host allows.

Every kernel runs under an exit-status wrapper (`_exitwrap.py`, a few lines of `/bin/sh` outside
its process group and cgroups) that leaves the kernel's exit status in a file, and the runtime
records the kernel in its work directory (`_kernel_record.py`: pids with their start times,
devices, cgroups, log files, how far the logs were shipped). That is what lets a restarted agent
adopt the kernels an agent stopped under the `leave` policy left running (`adoption`): a kernel
still running is watched by polling its wrapper, one that ended meanwhile is reported with its real
exit status, and only one with neither is lost.

An agent running as root may run each kernel as its owner's Unix user (`run_as`, `_run_as.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shlex
import shutil
import signal
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from corral.agent.runtime import (
    LOG_STREAMS,
    Adoption,
    KernelLaunch,
    LeftKernel,
    RuntimeNotes,
    StageFailure,
)
from corral.agent.runtime import _exitwrap as exitwrap
from corral.agent.runtime._cgroups import Cgroup, CgroupProbe, probe_cgroups, release_cgroups
from corral.agent.runtime._children import Child, spawn
from corral.agent.runtime._host_python import DEFAULT_PATH, host_python, outside_corral_venv
from corral.agent.runtime._kernel_record import (
    EXIT_FILE,
    RECORD_FILE,
    KernelRecord,
    ProcessIdentity,
    RecordError,
    running_since,
)
from corral.agent.runtime._process_kernel import AdoptedKernel, ProcessKernel
from corral.agent.runtime._run_as import RunAs, give_to
from corral.domain.failure_causes import FailureCause
from corral.domain.record import record

__all__ = ["BUILTIN_IMAGES", "AdoptedKernel", "ProcessKernel", "ProcessRuntime"]

logger = logging.getLogger(__name__)

SHELL = exitwrap.SHELL
BUILTIN_IMAGES = ("python", "shell")
MemoryLimitMode = Literal["cgroup", "rlimit", "off"]
CpuLimitMode = Literal["cgroup", "none"]

_PYTHON_NAMES = frozenset({"python", "python3"})
# The agent's environment may hold secrets: a kernel gets only these from it.
_BASE_ENV = ("PATH", "HOME", "LANG", "TMPDIR")
_IDLE_SCRIPT = "while :; do sleep 3600; done"


@record
class _Image:
    """An environment kernels run in: its interpreter and the variables it sets."""

    name: str
    interpreter: Path
    shell: bool = False
    venv: Path | None = None

    def variables(self, path: str) -> dict[str, str]:
        """The image's environment variables, given the base PATH."""
        if self.shell:
            return {}
        bin_dir = self.venv / "bin" if self.venv is not None else self.interpreter.parent
        # Unbuffered, so a python kernel's log lines reach stdout.log as they are printed.
        env = {"PATH": f"{bin_dir}{os.pathsep}{path}", "PYTHONUNBUFFERED": "1"}
        if self.venv is not None:
            env["VIRTUAL_ENV"] = str(self.venv)
        return env

    def argv(self, command: tuple[str, ...]) -> list[str]:
        """The argv that runs `command` under this image (see the module docstring)."""
        if not command:
            return [SHELL, "-c", _IDLE_SCRIPT]
        if self.shell:
            return [SHELL, "-c", command[0] if len(command) == 1 else shlex.join(command)]
        if command[0] in _PYTHON_NAMES:
            return [str(self.interpreter), *command[1:]]
        return list(command)


class ProcessRuntime:
    """Runs kernels as real child processes on this host (the agent's default runtime)."""

    def __init__(
        self,
        images: Mapping[str, str | Path] | None = None,
        *,
        python: str | Path | None = None,
        memory_limits: bool = True,
        host: str | None = None,
        adopted_poll_s: float = 0.5,
        run_as: RunAs | None = None,
    ) -> None:
        clashes = sorted(set(images or {}) & set(BUILTIN_IMAGES))
        if clashes:
            raise ValueError(f"images {clashes} are built in; configure them under other names")
        self._images = {name: Path(location) for name, location in (images or {}).items()}
        # `python`: an interpreter or a venv, like the extras; checked now, so a wrong setting
        # stops the agent at its start instead of failing every kernel.
        try:
            self._python = _located("python", Path(python) if python else host_python())
        except StageFailure as exc:
            raise ValueError(f"--python: {exc.message}") from exc
        self._host = host or socket.gethostname()
        # Checked now, like `python`: an agent that cannot become its kernels' users says so
        # at its start.
        self._run_as = run_as or RunAs()
        self._setpriv = self._run_as.check()
        try:
            self._setsid = exitwrap.find_setsid()
        except OSError as exc:
            raise ValueError(str(exc)) from exc
        # An adopted kernel is not the agent's child: how often it checks that it still runs.
        self._adopted_poll_s = adopted_poll_s
        self._cgroups = probe_cgroups(("memory", "cpu") if memory_limits else ("cpu",))
        self._mode: MemoryLimitMode = "cgroup" if self._cgroups.parent("memory") else "rlimit"
        where = _where(
            self._cgroups, "memory", "", "best effort (RLIMIT_AS, not for kernels holding GPUs)"
        )
        if not memory_limits:
            self._mode, where = "off", "off (disabled in the agent's configuration)"
        self._memory_note = f"memory limits: {where}"
        self._cpu_mode: CpuLimitMode = "cgroup" if self._cgroups.parent("cpu") else "none"
        where = _where(
            self._cgroups,
            "cpu",
            " (a CFS quota from the cpu slot)",
            "not enforced (kernels share the host's cores)",
        )
        self._cpu_note = f"cpu limits: {where}"

    @property
    def name(self) -> str:
        """Always "process"."""
        return "process"

    @property
    def black_box(self) -> bool:
        """False: this runtime reports every stage."""
        return False

    @property
    def memory_limit_mode(self) -> MemoryLimitMode:
        """How the `mem` slot is enforced on this host."""
        return self._mode

    @property
    def cpu_limit_mode(self) -> CpuLimitMode:
        """How the `cpu` slot is enforced on this host."""
        return self._cpu_mode

    @property
    def adoption(self) -> Adoption:
        """This runtime itself: it adopts the kernels an earlier agent left running."""
        return self

    @property
    def python(self) -> Path:
        """The interpreter `python` means in kernels (a venv's `bin/python` for a venv)."""
        return self._python.interpreter

    def notes(self) -> RuntimeNotes:
        """The limits this runtime can and cannot enforce here, for the agent's startup log."""
        python = f"python: {self._python.venv or self._python.interpreter}"
        return RuntimeNotes(lines=(self._memory_note, self._cpu_note, python))

    async def preload(self, launch: KernelLaunch) -> None:
        """Resolve the image and create the kernel's work and output directories."""
        self._image(launch.image)
        try:
            # On the event loop: three mkdir calls on the agent's own disk cost less than the
            # hop to a thread and back (~1.5 ms of the loop's time on a busy host).
            launch.output_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            message = f"cannot create {launch.output_dir}: {exc}"
            raise StageFailure(FailureCause.WORK_DIR_FAILURE, message) from exc

    async def start(self, launch: KernelLaunch) -> ProcessKernel:
        """Spawn the kernel in its own session, logs to files in its work directory."""
        image = self._image(launch.image)
        user = self._run_as.user(launch.owner)
        base = {key: os.environ[key] for key in _BASE_ENV if key in os.environ}
        base["PATH"] = outside_corral_venv(base.get("PATH", "")) or DEFAULT_PATH
        if user is not None:
            base.update(user.variables())
        cwd, elsewhere = self._start_dir(launch)
        env = {**base, **image.variables(base["PATH"]), **launch.environment(cwd)}
        argv = image.argv(launch.command)
        if not _executable_exists(argv[0], env.get("PATH", ""), cwd):
            message = f"{argv[0]!r} is not an executable on the kernel's PATH (image {image.name})"
            raise StageFailure(FailureCause.KERNEL_START_FAILURE, message, retryable=False)
        if user is not None:
            assert self._setpriv is not None  # checked by RunAs.check() for this mode
            argv = user.argv(self._setpriv, argv)  # innermost: the wrappers still run as us
            try:
                await asyncio.to_thread(give_to, user, launch.output_dir, launch.upload_dir)
            except OSError as exc:
                message = f"cannot give the kernel's directories to {user.name!r}: {exc}"
                raise StageFailure(FailureCause.WORK_DIR_FAILURE, message) from exc
        try:
            # An exit status left by an earlier start of this kernel must not be read as its own.
            (launch.work_dir / EXIT_FILE).unlink(missing_ok=True)
            stdout, stderr = _open_logs(launch.work_dir, keep=launch.restart > 0)
            if elsewhere:
                os.write(stderr, elsewhere.encode())
        except OSError as exc:
            raise StageFailure(
                FailureCause.KERNEL_START_FAILURE, f"cannot open its logs: {exc}"
            ) from exc
        cgroups: tuple[Cgroup, ...] = ()
        try:
            limits = self._limits(launch)
            cgroups = limits.cgroups
            wrapper, kernel = await _spawn(
                launch, cwd, argv, env, stdout, stderr, self._setsid, limits
            )
        except OSError as exc:
            await release_cgroups(cgroups)
            message = f"cannot start the kernel: {exc}"
            raise StageFailure(FailureCause.KERNEL_START_FAILURE, message, retryable=False) from exc
        except asyncio.CancelledError:
            await asyncio.shield(release_cgroups(cgroups))  # _spawn killed what it started
            raise
        finally:
            os.close(stdout)
            os.close(stderr)
        record = KernelRecord(
            kernel_id=launch.kernel_id,
            work_dir=launch.work_dir,
            wrapper=ProcessIdentity(wrapper.pid, kernel.wrapper_start_ticks),
            kernel=kernel.identity,
            devices=launch.devices,
            cgroups=cgroups,
            logs={stream: launch.work_dir / f"{stream}.log" for stream in LOG_STREAMS},
            cwd=cwd,
            port=launch.port,
            restart=launch.restart,
        )
        try:
            record.write()  # a small file on the agent's disk: no thread hop (see preload)
        except OSError as exc:
            unwritten = {"kernel_id": str(launch.kernel_id), "error": str(exc)}
            logger.warning("runtime.kernel_record_unwritten", extra=unwritten)  # not adoptable
        extra = {"kernel_id": str(launch.kernel_id), "pid": kernel.identity.pid, "cwd": str(cwd)}
        logger.info("runtime.kernel_started", extra={**extra, "image": image.name})
        return ProcessKernel(launch, wrapper, record, self._host)

    async def find_left(self, kernels_dir: Path) -> list[LeftKernel]:
        """The kernels recorded in the work directories under `kernels_dir`."""
        return list(await asyncio.to_thread(_read_records, kernels_dir))

    async def adopt(self, left: LeftKernel, launch: KernelLaunch) -> AdoptedKernel:
        """Watch a recorded kernel: it runs on, it ended (its exit status), or it was lost."""
        record = _as_record(left)
        kernel = AdoptedKernel(launch, record, self._host, self._adopted_poll_s)
        extra = {"kernel_id": str(record.kernel_id), "pid": record.kernel.pid}
        logger.info("runtime.kernel_adopted", extra={**extra, "running": record.wrapper.alive()})
        return kernel

    async def discard(self, left: LeftKernel) -> None:
        """Kill a recorded kernel that is not this agent's any more; remove its cgroups, record."""
        record = _as_record(left)
        # The wrapper first, so it does not write an exit status after the record is gone.
        for process, kill in ((record.wrapper, os.kill), (record.kernel, os.killpg)):
            if process.alive():
                with contextlib.suppress(ProcessLookupError):
                    kill(process.pid, signal.SIGKILL)
        await release_cgroups(c for c in record.cgroups if c.path.exists())
        await asyncio.to_thread(record.remove)
        logger.info("runtime.kernel_discarded", extra={"kernel_id": str(record.kernel_id)})

    def _limits(self, launch: KernelLaunch) -> _Limits:
        """How the kernel's `mem` and `cpu` slots are applied: its cgroups (made now), or an
        address space limit."""
        limit_bytes = launch.slots.get("mem", 0) // 1000
        # No cgroup carries "memory" when memory limits are off: the probe did not look for it.
        limits = {"memory": limit_bytes, "cpu": launch.slots.get("cpu", 0)}  # cpu: milli-cpus
        wanted = {controller: value for controller, value in limits.items() if value > 0}
        cgroups = self._cgroups.create(f"corral-{launch.kernel_id}", wanted)
        address_space_kib = None
        if self._mode == "rlimit" and limit_bytes > 0 and not launch.devices:
            address_space_kib = max(1, limit_bytes // 1024)
        return _Limits(cgroups, address_space_kib)

    def _image(self, name: str) -> _Image:
        if name == "python":
            return self._python
        if name == "shell":
            return _Image(name, Path(SHELL), shell=True)
        location = self._images.get(name)
        if location is None:
            known = ", ".join(sorted({*BUILTIN_IMAGES, *self._images}))
            raise StageFailure(
                FailureCause.IMAGE_PULL_FAILURE,
                f"unknown image {name!r}; this agent knows: {known}",
            )
        return _located(name, location)

    def _start_dir(self, launch: KernelLaunch) -> tuple[Path, str]:
        """Where the kernel starts, and a line for its stderr when not where the user asked."""
        if launch.workdir is None or launch.workdir.is_dir():
            return launch.start_dir, ""
        extra = {"kernel_id": str(launch.kernel_id), "workdir": str(launch.workdir)}
        logger.warning("runtime.workdir_missing", extra=extra)
        return launch.work_dir, (
            f"corral: workdir {launch.workdir} does not exist on {self._host}; the kernel "
            f"starts in its own directory {launch.work_dir} (use --upload DIR to send files)\n"
        )


def _located(name: str, location: Path) -> _Image:
    """The image at `location`: an interpreter, or a venv directory (its `bin/python`)."""
    venv = location if location.is_dir() else None
    # Not resolved: a venv's python is a link, and its bin directory must stay first on PATH.
    image = _Image(name, location / "bin" / "python" if venv else location, venv=venv)
    if not os.access(image.interpreter, os.X_OK) or not image.interpreter.is_file():
        raise StageFailure(
            FailureCause.IMAGE_PULL_FAILURE,
            f"image {name!r}: interpreter {image.interpreter} does not exist or is not "
            "executable; fix the agent's image configuration",
        )
    return image


@record
class _Limits:
    """What the kernel's first process applies to itself before it runs the command."""

    cgroups: tuple[Cgroup, ...]
    address_space_kib: int | None


@record
class _Started:
    """What the exit-status wrapper said once the kernel was started."""

    identity: ProcessIdentity  # the kernel's first process, its group's leader
    wrapper_start_ticks: int | None


async def _spawn(
    launch: KernelLaunch,
    cwd: Path,
    argv: list[str],
    env: Mapping[str, str],
    stdout: int,
    stderr: int,
    setsid: str,
    limits: _Limits,
) -> tuple[Child, _Started]:
    """Start `argv` under the exit-status wrapper, within `limits`; the wrapper and the
    started kernel."""
    status_r, status_w = os.pipe()
    try:
        wrapped = exitwrap.argv(
            str(cwd),
            str(launch.work_dir / EXIT_FILE),
            setsid,
            argv,
            cgroup_procs=[str(cgroup.path / "cgroup.procs") for cgroup in limits.cgroups],
            address_space_kib=limits.address_space_kib,
        )
        fds = {1: stdout, 2: stderr, exitwrap.STATUS_FD: status_w}
        wrapper = spawn(wrapped, env, fds, default_signals=exitwrap.RESTORED)
    except BaseException:
        os.close(status_r)
        raise
    finally:
        os.close(status_w)
    # The wrapper answers as soon as the kernel leads its own group. Shielded: a start cancelled
    # meanwhile still learns the kernel's pid, and kills it instead of leaving it behind.
    answer = asyncio.ensure_future(_read_line(status_r))
    try:
        words = (await asyncio.shield(answer)).split()
    except asyncio.CancelledError:
        words = (await answer).split()
        if words[:1] == ["started"]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(words[1]), signal.SIGKILL)
        await wrapper.wait()
        raise
    if words[:1] == ["started"] and len(words) == 2:
        pid = int(words[1])
        kernel = ProcessIdentity(pid, running_since(pid))
        return wrapper, _Started(kernel, running_since(wrapper.pid))
    code = await wrapper.wait()
    if words[:1] == ["failed"] and len(words) >= 2:
        if words[1] == exitwrap.NO_ERRNO:
            raise OSError(" ".join(words[2:]))
        raise OSError(int(words[1]), " ".join(words[2:]))
    raise OSError(f"its exit-status wrapper ended (status {code}) before starting it")


async def _read_line(fd: int) -> str:
    """The first line the wrapper writes to the pipe `fd` (what came before EOF, if no line).

    Read as the event loop finds the pipe readable: no thread. The pipe is closed after.
    """
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    received = bytearray()
    done: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return
        received.extend(chunk)
        if (not chunk or b"\n" in chunk) and not done.done():
            done.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    return received.split(b"\n", 1)[0].decode(errors="replace")


def _read_records(kernels_dir: Path) -> list[KernelRecord]:
    if not kernels_dir.is_dir():
        return []
    records = []
    for work_dir in sorted(kernels_dir.iterdir()):
        path = work_dir / RECORD_FILE
        if not path.exists():
            continue
        try:
            records.append(KernelRecord.read(path))
        except RecordError as exc:
            logger.warning("runtime.kernel_record_unreadable", extra={"error": str(exc)})
    return records


def _as_record(left: LeftKernel) -> KernelRecord:
    if not isinstance(left, KernelRecord):
        raise TypeError(f"{left!r} was not found by the process runtime; adopt its own finds")
    return left


def _executable_exists(name: str, path: str, cwd: Path) -> bool:
    """Whether `name` is an executable where the kernel's exec will look it up."""
    if os.sep not in name:
        return shutil.which(name, path=path) is not None
    candidate = cwd / name  # an absolute name stays itself
    return candidate.is_file() and os.access(candidate, os.X_OK)


def _open_logs(work_dir: Path, *, keep: bool = False) -> tuple[int, int]:
    """Fresh stdout.log and stderr.log; files, not pipes, so a chatty kernel never blocks.
    `keep` (a restart): appended to, so the offsets shipped so far stay valid."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (os.O_APPEND if keep else os.O_TRUNC)
    stdout = os.open(work_dir / "stdout.log", flags, 0o644)
    try:
        return stdout, os.open(work_dir / "stderr.log", flags, 0o644)
    except OSError:
        os.close(stdout)
        raise


def _where(probe: CgroupProbe, controller: str, how: str, otherwise: str) -> str:
    """Where a kernel's `controller` limit is enforced, for the startup notes (or why not)."""
    parent = probe.parent(controller)
    if parent is not None:
        return f"cgroup v{parent.version} under {parent.path}{how}"
    return f"{otherwise}; cgroups: {probe.reasons.get(controller)}"
