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

A prepared kernel is staged (`stage`): its processes are started up to the command, which waits
on a go pipe, so that `start` is one line on that pipe (`_exitwrap.py` says why it pays). Where
a process's join of a cgroup waits for an RCU grace period, a lone kernel's staging takes the
runtime's spare instead, processes already in cgroups of their own (the part on the spare, in
ProcessRuntime).
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
import uuid
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
from corral.agent.runtime._process_kernel import AdoptedKernel, ProcessKernel, signal_kernel
from corral.agent.runtime._run_as import RunAs, give_to
from corral.domain.failure_causes import FailureCause
from corral.domain.record import record
from corral.domain.types import KernelId

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
SPARE_PREFIX = "corral-spare-"  # a spare's cgroups (named so before it knows its kernel)
# A spare is made this long after the last was taken: off the path of the start it serves.
SPARE_AFTER_S = 0.05
START_SCRIPT = ".corral-start.sh"  # in a kernel's work directory, while a spare reads it


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
        spare: bool | None = None,
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
        self._staged: dict[KernelId, _Spawned] = {}  # waiting for `start` (see `stage`)
        self._preparing: set[KernelId] = set()  # preloaded, not yet started nor given up
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
        # A spare between `open` and `close`; None: where a kernel's join of its cgroups may wait.
        slow_moves = bool(self._cgroups.parents) and not self._cgroups.quick_moves
        self._spare_wanted = slow_moves if spare is None else spare
        self._spare: asyncio.Task[_Spawned | None] | None = None  # made, or being made
        self._spare_due: asyncio.TimerHandle | None = None
        self._open = False
        spared = (
            "a spare kernel process waits in cgroups of its own to take that wait off a lone "
            "kernel's start; "
            if self._spare_wanted
            else ""
        )
        self._moves_note: tuple[str, ...] = ()
        if self._cgroups.parents:
            self._moves_note = (
                "cgroup moves: quick (a cgroup2 hierarchy is mounted with favordynmods)"
                if self._cgroups.quick_moves
                else "cgroup moves: a kernel's move into its cgroups may wait for an RCU grace "
                f"period (5-16 ms on an idle host); {spared}mounting cgroup2 with favordynmods "
                "(Linux 6.0 or newer) avoids it",
            )

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
        return RuntimeNotes(lines=(self._memory_note, self._cpu_note, *self._moves_note, python))

    async def open(self) -> None:
        """The agent starts: the spare (if this runtime keeps one) is made, and the cgroups of
        spares an agent killed before left behind are removed."""
        self._open = True
        if self._spare_wanted:
            self._cgroups.remove_empty(SPARE_PREFIX, _of_a_dead_agent)
            self._make_spare()

    async def close(self) -> None:
        """The agent stops: the spare ends (its processes and cgroups); none is made again."""
        self._open = False
        if self._spare_due is not None:
            self._spare_due.cancel()
            self._spare_due = None
        making, self._spare = self._spare, None
        if making is not None:
            spare = await making
            if spare is not None:
                await spare.abandon()

    async def preload(self, launch: KernelLaunch) -> None:
        """Resolve the image and create the kernel's work and output directories."""
        self._preparing.add(launch.kernel_id)  # until started or given up (`unstage`)
        self._image(launch.image)
        try:
            # On the event loop: two mkdir calls on the agent's own disk cost less than the
            # hop to a thread and back (~1.5 ms of the loop's time on a busy host).
            _make_work_dirs(launch)
        except OSError as exc:
            message = f"cannot create {launch.output_dir}: {exc}"
            raise StageFailure(FailureCause.WORK_DIR_FAILURE, message) from exc

    @property
    def stages(self) -> bool:
        """True: a prepared kernel is staged (`stage`)."""
        return True

    async def stage(self, launch: KernelLaunch) -> None:
        """Start the kernel's processes up to its command, which runs once `start` is called.

        Everything before the command — the exit-status wrapper, `setsid`, the kernel's limits
        (a cgroup join may wait for an RCU grace period) — is done while the manager moves the
        session on, so that `start` only has to say go. Best effort: where staging fails,
        `start` does it all again and reports what fails then.
        """
        # Only the one kernel between preload and start: staging pays off on an idle agent,
        # where it overlaps the manager's round trip. Among several (a burst, a gang) the spawns
        # would hold up the agent's reports and the others' starts, and on cgroup v1 a cgroup
        # join waiting for its grace period holds up every fork on the host meanwhile.
        if self._preparing != {launch.kernel_id}:
            return
        try:
            plan = await self._plan(launch)
            spawned = await self._from_spare(launch, plan)
            if spawned is None:
                spawned = await self._spawn_kernel(launch, plan, staged=True)
        except StageFailure as exc:
            extra = {"kernel_id": str(launch.kernel_id), "error": exc.message}
            logger.info("runtime.kernel_not_staged", extra=extra)
            return
        finally:
            self._spare_soon()
        self._staged[launch.kernel_id] = spawned

    async def unstage(self, launch: KernelLaunch) -> None:
        """Give up a staged kernel that will not be started: its processes end without running
        its command, and its cgroups are removed. Nothing to do for one not staged."""
        self._preparing.discard(launch.kernel_id)
        spawned = self._staged.pop(launch.kernel_id, None)
        if spawned is not None:
            await spawned.abandon()

    async def start(self, launch: KernelLaunch) -> ProcessKernel:
        """Run the kernel in its own session, logs to files in its work directory (staged
        already, or spawned now)."""
        self._preparing.discard(launch.kernel_id)
        spawned = self._staged.pop(launch.kernel_id, None)
        if spawned is not None and spawned.launch != launch:  # staged for another run of it
            await spawned.abandon()
            spawned = None
        try:
            if spawned is not None:
                try:
                    kernel = await spawned.run()
                except _Vanished:
                    # Its processes were killed while staged (an admin, the OOM killer): anew.
                    await spawned.abandon()
                    spawned = None
            if spawned is None:
                spawned = await self._spawn_kernel(launch, await self._plan(launch), staged=False)
                kernel = await spawned.run()
        except OSError as exc:
            message = f"cannot start the kernel: {exc}"
            raise StageFailure(FailureCause.KERNEL_START_FAILURE, message, retryable=False) from exc
        record = KernelRecord(
            kernel_id=launch.kernel_id,
            work_dir=launch.work_dir,
            wrapper=ProcessIdentity(spawned.wrapper.pid, running_since(spawned.wrapper.pid)),
            kernel=kernel,
            devices=launch.devices,
            cgroups=spawned.cgroups,
            logs={stream: launch.work_dir / f"{stream}.log" for stream in LOG_STREAMS},
            cwd=spawned.cwd,
            port=launch.port,
            restart=launch.restart,
        )
        try:
            record.write()  # a small file on the agent's disk: no thread hop (see preload)
        except OSError as exc:
            unwritten = {"kernel_id": str(launch.kernel_id), "error": str(exc)}
            logger.warning("runtime.kernel_record_unwritten", extra=unwritten)  # not adoptable
        extra = {"kernel_id": str(launch.kernel_id), "pid": kernel.pid, "cwd": str(spawned.cwd)}
        logger.info("runtime.kernel_started", extra={**extra, "image": launch.image})
        return ProcessKernel(launch, spawned.wrapper, record, self._host)

    async def _plan(self, launch: KernelLaunch) -> _Plan:
        """What the kernel's first process runs, where, with which environment (its
        directories given to its user, when it runs as one)."""
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
        return _Plan(argv, env, cwd, elsewhere)

    async def _spawn_kernel(self, launch: KernelLaunch, plan: _Plan, *, staged: bool) -> _Spawned:
        """The kernel's processes up to its command (`staged`: waiting to be told to go, which
        they said they are), its logs opened and its cgroups made."""
        try:
            stdout, stderr = _fresh_logs(launch, plan)
        except OSError as exc:
            raise StageFailure(
                FailureCause.KERNEL_START_FAILURE, f"cannot open its logs: {exc}"
            ) from exc
        cgroups: tuple[Cgroup, ...] = ()
        try:
            limits = self._limits(launch)
            cgroups = limits.cgroups
            spawned = _spawn(launch, plan, stdout, stderr, self._setsid, limits, staged)
        except OSError as exc:
            await release_cgroups(cgroups)
            message = f"cannot start the kernel: {exc}"
            raise StageFailure(FailureCause.KERNEL_START_FAILURE, message, retryable=False) from exc
        finally:
            os.close(stdout)
            os.close(stderr)
        if staged:
            try:
                await spawned.said("ready")
            except OSError as exc:
                message = f"cannot start the kernel: {exc}"
                raise StageFailure(
                    FailureCause.KERNEL_START_FAILURE, message, retryable=False
                ) from exc
        return spawned

    # -- the spare ---------------------------------------------------------------------------
    #
    # Where a process's join of a cgroup waits for an RCU grace period (cgroup v1, or v2
    # without favordynmods: 5-16 ms on an idle host, longer than the manager takes to say go),
    # the runtime keeps one spare: the exit-status wrapper and the kernel's side, started with
    # no environment and already in cgroups of their own (every hierarchy this agent limits
    # in, no limit yet), waiting for a start script. A lone kernel's staging takes it: the
    # kernel's limits are written to those cgroups, its logs made, and the spare sources a
    # script that gives it the kernel's directory, environment, logs and command
    # (`exitwrap.spare_start`), and is then staged as any kernel; its wrapper learns the exit
    # file's path on a pipe of its own. A new spare is made SPARE_AFTER_S later. Kernels
    # started together (a burst) do not stage, and do not use it.

    def _make_spare(self) -> None:
        self._spare_due = None
        if self._spare_wanted and self._open and self._spare is None:
            self._spare = asyncio.create_task(self._new_spare(), name="runtime-spare")

    def _spare_soon(self) -> None:
        """A spare SPARE_AFTER_S from now, unless one is there or on its way."""
        wanted = self._spare_wanted and self._open and self._spare is None
        if wanted and self._spare_due is None:
            loop = asyncio.get_running_loop()
            self._spare_due = loop.call_later(SPARE_AFTER_S, self._make_spare)

    async def _new_spare(self) -> _Spawned | None:
        """A spare, waiting in its cgroups (None, said in the log, when one cannot be made)."""
        try:
            name = f"{SPARE_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"
            cgroups = self._cgroups.create(name, None)
            try:
                spare = _spawn_spare(cgroups, self._setsid)
            except OSError:
                await release_cgroups(cgroups)
                raise
            await spare.said(exitwrap.SPARE)
        except OSError as exc:
            logger.warning("runtime.spare_failed", extra={"error": str(exc)})
            return None
        return spare

    async def _from_spare(self, launch: KernelLaunch, plan: _Plan) -> _Spawned | None:
        """The spare, staged as `launch`'s kernel; None if there is none or it cannot be (then
        the kernel is staged the ordinary way)."""
        making = self._spare
        if making is None or not _fits_a_spare(launch, plan):
            return None
        self._spare = None
        spare = await making  # being made: it began before this kernel's own spawn could
        if spare is None:
            return None
        try:
            address_space_kib = self._limits_wanted(launch, spare.cgroups)
            stdout, stderr = _fresh_logs(launch, plan)
            os.close(stdout)
            os.close(stderr)
            script = exitwrap.spare_start(
                str(plan.cwd),
                plan.env,
                str(launch.work_dir / "stdout.log"),
                str(launch.work_dir / "stderr.log"),
                plan.argv,
                address_space_kib=address_space_kib,
            )
            await spare.claim(launch, plan.cwd, script)
        except OSError as exc:
            await spare.abandon()
            extra = {"kernel_id": str(launch.kernel_id), "error": str(exc)}
            logger.warning("runtime.spare_not_taken", extra=extra)
            return None
        spare.cgroups = tuple(c.renamed(f"corral-{launch.kernel_id}") for c in spare.cgroups)
        return spare

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
        wanted = _cgroup_limits(launch)
        cgroups = self._cgroups.create(f"corral-{launch.kernel_id}", wanted)
        return _Limits(cgroups, self._address_space_kib(launch))

    def _limits_wanted(self, launch: KernelLaunch, cgroups: tuple[Cgroup, ...]) -> int | None:
        """The kernel's limits written to a spare's `cgroups`; its address space limit."""
        wanted = _cgroup_limits(launch)
        for cgroup in cgroups:
            cgroup.limit(wanted)
        return self._address_space_kib(launch)

    def _address_space_kib(self, launch: KernelLaunch) -> int | None:
        limit_bytes = launch.slots.get("mem", 0) // 1000
        if self._mode == "rlimit" and limit_bytes > 0 and not launch.devices:
            return max(1, limit_bytes // 1024)
        return None

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


def _of_a_dead_agent(name: str) -> bool:
    """Whether a spare's cgroup (`corral-spare-<agent pid>-<hex>`) is a dead agent's: another
    agent on this host may be making its spare in an empty one of its own just now."""
    pid = name.removeprefix(SPARE_PREFIX).partition("-")[0]
    if not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _cgroup_limits(launch: KernelLaunch) -> dict[str, int]:
    """The kernel's cgroup limits by controller: `mem` in bytes, `cpu` in milli-cpus."""
    # No cgroup carries "memory" when memory limits are off: the probe did not look for it.
    limits = {"memory": launch.slots.get("mem", 0) // 1000, "cpu": launch.slots.get("cpu", 0)}
    return {controller: value for controller, value in limits.items() if value > 0}


def _make_work_dirs(launch: KernelLaunch) -> None:
    """The kernel's work directory and its output directory in it, in two calls where both
    are new (`mkdir(parents=True)` first tries the inner one and fails); the kernels
    directory too when it is gone."""
    try:
        launch.work_dir.mkdir(exist_ok=True)
    except FileNotFoundError:
        launch.work_dir.mkdir(parents=True, exist_ok=True)
    launch.output_dir.mkdir(exist_ok=True)


def _fits_a_spare(launch: KernelLaunch, plan: _Plan) -> bool:
    """Whether a spare can become this kernel: a shell can give it its environment, and its
    exit file's path can go on a line."""
    exit_file = str(launch.work_dir / EXIT_FILE)
    return exitwrap.can_take_spare(plan.env) and "\n" not in exit_file and exit_file.isprintable()


def _fresh_logs(launch: KernelLaunch, plan: _Plan) -> tuple[int, int]:
    """The kernel's logs opened fresh (appended to on a restart), the line saying where it
    starts instead of its workdir written; an exit status an earlier start left removed."""
    # An exit status left by an earlier start of this kernel must not be read as its own.
    (launch.work_dir / EXIT_FILE).unlink(missing_ok=True)
    stdout, stderr = _open_logs(launch.work_dir, keep=launch.restart > 0)
    try:
        if plan.elsewhere:
            os.write(stderr, plan.elsewhere.encode())
    except OSError:
        os.close(stdout)
        os.close(stderr)
        raise
    return stdout, stderr


@record
class _Plan:
    """What a kernel's first process becomes: its argv, environment and start directory, and
    a line for its stderr when that is not where the user asked."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    elsewhere: str


@record
class _Limits:
    """What the kernel's first process applies to itself before it runs the command."""

    cgroups: tuple[Cgroup, ...]
    address_space_kib: int | None


def _spawn(
    launch: KernelLaunch,
    plan: _Plan,
    stdout: int,
    stderr: int,
    setsid: str,
    limits: _Limits,
    staged: bool,
) -> _Spawned:
    """Start the plan's argv under the exit-status wrapper, within `limits` (`staged`: to wait
    for go)."""
    wrapped = exitwrap.argv(
        str(plan.cwd),
        str(launch.work_dir / EXIT_FILE),
        setsid,
        plan.argv,
        cgroup_procs=[str(cgroup.path / "cgroup.procs") for cgroup in limits.cgroups],
        address_space_kib=limits.address_space_kib,
        staged=staged,
    )
    spawned = _wrapper(wrapped, plan.env, {1: stdout, 2: stderr}, staged, limits.cgroups)
    spawned.launch, spawned.cwd = launch, plan.cwd
    return spawned


def _spawn_spare(cgroups: tuple[Cgroup, ...], setsid: str) -> _Spawned:
    """Start a spare in `cgroups` (see ProcessRuntime's part on the spare)."""
    argv = exitwrap.spare_argv(setsid, cgroup_procs=[str(c.path / "cgroup.procs") for c in cgroups])
    null = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        return _wrapper(argv, {}, {1: null, 2: null}, True, cgroups, exit_path=True)
    finally:
        os.close(null)


def _wrapper(
    argv: list[str],
    env: Mapping[str, str],
    fds: Mapping[int, int],
    staged: bool,
    cgroups: tuple[Cgroup, ...],
    *,
    exit_path: bool = False,
) -> _Spawned:
    """Spawn a wrapper's argv with `fds`, its status pipe on STATUS_FD (and, `staged`, its go
    pipe on GO_FD; `exit_path`, the pipe its exit file's path comes on, on EXIT_PATH_FD)."""
    status_r, status_w = os.pipe()
    go_r, go_w = os.pipe() if staged else (None, None)
    path_r, path_w = os.pipe() if exit_path else (None, None)
    try:
        given = {**fds, exitwrap.STATUS_FD: status_w}
        if go_r is not None:
            given[exitwrap.GO_FD] = go_r
        if path_r is not None:
            given[exitwrap.EXIT_PATH_FD] = path_r
        wrapper = spawn(argv, env, given, default_signals=exitwrap.RESTORED)
    except BaseException:
        for fd in (status_r, go_w, path_w):
            if fd is not None:
                os.close(fd)
        raise
    finally:
        for fd in (status_w, go_r, path_r):
            if fd is not None:
                os.close(fd)
    return _Spawned(wrapper, _StatusPipe(status_r), go_w, cgroups, exit_path=path_w)


class _Spawned:
    """A kernel's processes under way: the wrapper, what they say on the status pipe, and (for
    a staged kernel) the go pipe's write end; the agent is the only holder of that end, so the
    kernel's processes end unstarted when it is closed or the agent dies. A spare has no
    launch until it is claimed."""

    def __init__(
        self,
        wrapper: Child,
        status: _StatusPipe,
        go: int | None,
        cgroups: tuple[Cgroup, ...],
        *,
        exit_path: int | None = None,
    ) -> None:
        self.launch: KernelLaunch | None = None
        self.cwd = Path("/")
        self.wrapper = wrapper
        self.cgroups = cgroups
        self._status = status
        self._go = go
        self._exit_path = exit_path
        self._abandoned = False

    async def said(self, word: str) -> None:
        """Until the kernel's side says `word` (`ready`: a staged kernel waits for go; `spare`:
        a spare waits for its start script). OSError: it cannot, and was given up."""
        try:
            words = (await self._status.line()).split()
            if words[:1] != [word]:
                raise await self._failure(words)
        except BaseException:
            await asyncio.shield(self.abandon())
            raise

    async def claim(self, launch: KernelLaunch, cwd: Path, script: str) -> None:
        """Make this spare `launch`'s staged kernel: it sources `script` (written to the
        kernel's work directory for the moment), and says it is ready. OSError: it did not."""
        assert self._go is not None and self._exit_path is not None, "not a spare"
        path = launch.work_dir / START_SCRIPT
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        descriptor = os.open(path, flags, 0o600)  # the kernel's environment: the agent's only
        try:
            os.write(descriptor, script.encode(errors="surrogateescape"))
        finally:
            os.close(descriptor)
        try:
            # The exit file's path first: a spare that died unclaimed has its wrapper wait for
            # it, holding the status pipe open; given it, the wrapper ends (the status it
            # writes is removed with the ordinary staging that follows, see `_fresh_logs`).
            os.write(self._exit_path, f"{launch.work_dir / EXIT_FILE}\n".encode())
            os.close(self._exit_path)
            self._exit_path = None
            os.write(self._go, f"{path}\n".encode())
            self.launch, self.cwd = launch, cwd
            await self.said("ready")
        finally:
            path.unlink(missing_ok=True)

    async def run(self) -> ProcessIdentity:
        """Let the command run (a staged kernel is told to go); the kernel, once it runs.

        OSError: it could not start (its processes ended, its cgroups are removed). Cancelled
        meanwhile, the kernel is still waited for, then killed, so none is left behind.
        """
        if self._go is not None:
            with contextlib.suppress(OSError):  # gone already: its status says why
                os.write(self._go, b"go\n")
            self._close_go()
        answer = asyncio.ensure_future(self._status.line())
        try:
            words = (await asyncio.shield(answer)).split()
        except asyncio.CancelledError:
            words = (await answer).split()
            if words[:1] == ["started"]:
                pid = int(words[1])
                signal_kernel(ProcessIdentity(pid, running_since(pid)), signal.SIGKILL)
            await asyncio.shield(self.abandon())
            raise
        if words[:1] == ["started"] and len(words) == 2:
            self._status.close()
            pid = int(words[1])
            return ProcessIdentity(pid, running_since(pid))
        failure = await self._failure(words)
        await self.abandon()
        raise failure

    async def abandon(self) -> None:
        """End the kernel's processes unstarted (or what is left of them), remove its cgroups
        (once: again, nothing to do)."""
        if self._abandoned:
            return
        self._abandoned = True
        self._close_go()
        if self._exit_path is not None:
            os.close(self._exit_path)
            self._exit_path = None
        self._status.close()
        await self.wrapper.wait()
        await release_cgroups(self.cgroups)

    async def _failure(self, words: list[str]) -> OSError:
        """What the kernel's side said instead of going on, as an OSError."""
        if words[:1] == ["failed"] and len(words) >= 2:
            if words[1] == exitwrap.NO_ERRNO:
                return OSError(" ".join(words[2:]))
            return OSError(int(words[1]), " ".join(words[2:]))
        self._close_go()
        code = await self.wrapper.wait()
        return _Vanished(f"its exit-status wrapper ended (status {code}) before starting it")

    def _close_go(self) -> None:
        if self._go is not None:
            os.close(self._go)
            self._go = None


class _Vanished(OSError):
    """The kernel's processes ended before they said how its start went."""


class _StatusPipe:
    """The lines the wrapper's kernel side writes to the status pipe, read as the event loop
    finds the pipe readable: no thread."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd
        self._loop = asyncio.get_running_loop()
        self._received = bytearray()
        self._ended = False
        self._arrived: asyncio.Future[None] | None = None
        os.set_blocking(fd, False)
        self._loop.add_reader(fd, self._readable)

    async def line(self) -> str:
        """The next line (at the end: what came before it, or "" when nothing did)."""
        while b"\n" not in self._received and not self._ended:
            self._arrived = self._loop.create_future()
            await self._arrived
        line, _, rest = bytes(self._received).partition(b"\n")
        self._received = bytearray(rest)
        return line.decode(errors="replace")

    def close(self) -> None:
        """Stop reading; the pipe is closed."""
        if self._fd is not None:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = None
        self._ended = True

    def _readable(self) -> None:
        assert self._fd is not None
        try:
            chunk = os.read(self._fd, 4096)
        except BlockingIOError:
            return
        self._received.extend(chunk)
        if not chunk:
            self._loop.remove_reader(self._fd)
            self._ended = True
        waiting = self._arrived is not None and not self._arrived.done()
        if waiting and (self._ended or b"\n" in self._received):
            assert self._arrived is not None
            self._arrived.set_result(None)


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
