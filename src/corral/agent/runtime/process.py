"""The `process` runtime: every kernel is a child process group on the agent's host.

Images name environments this agent knows: `python` (the agent's own interpreter), `shell`
(`/bin/sh`) and configured extras (an interpreter path, or a venv directory: its `bin/python`,
with VIRTUAL_ENV set). How a kernel's command runs under an image:

- python-like images: the command is an argv. `python` or `python3` as argv[0] is the image's
  interpreter; any other name is looked up on PATH, where the image's bin directory comes first.
- `shell`: `/bin/sh -c <script>`; a one-element command is the script, several are shlex-joined.
- an empty command (interactive sessions) idles until the kernel is terminated.

The kernel's `mem` slot is enforced by a cgroup per kernel (v2, else v1) where this host lets
the agent make one, else by RLIMIT_AS (best effort, and not for kernels holding GPUs: CUDA
reserves far more address space than it uses). Its `cpu` slot becomes a CFS quota in a cgroup
the same way (`cpu.max` on v2, `cpu.cfs_quota_us` on v1) where the host allows, else it is not
enforced. A tiny `/bin/sh` wrapper moves itself into the kernel's cgroups (one per v1
hierarchy) or limits itself, then execs the kernel, so nothing the kernel forks escapes the
limits. `notes()` says what this host allows.
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
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from corral.agent.runtime import (
    LOG_STREAMS,
    KernelExit,
    KernelLaunch,
    OutputFile,
    RuntimeNotes,
    StageFailure,
)
from corral.agent.runtime._cgroups import Cgroup, CgroupProbe, probe_cgroups, release_cgroups

logger = logging.getLogger(__name__)

SHELL = "/bin/sh"
BUILTIN_IMAGES = ("python", "shell")
MemoryLimitMode = Literal["cgroup", "rlimit", "off"]
CpuLimitMode = Literal["cgroup", "none"]

_PYTHON_NAMES = frozenset({"python", "python3"})
# The agent's environment may hold secrets: a kernel gets only these from it.
_BASE_ENV = ("PATH", "HOME", "LANG", "TMPDIR")
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
_IDLE_SCRIPT = "while :; do sleep 3600; done"
# Run as `sh -c WRAPPER corral-kernel <args...> <argv...>`: the wrapper limits its own pid,
# then execs the kernel in place, so the limits hold before the kernel can fork anything.
# The cgroup wrapper's args are `cgroup.procs` files (absolute paths) and then `--`.
_CGROUP_WRAPPER = (
    'until [ "$1" = -- ]; do echo $$ > "$1" || exit 126; shift; done; shift; exec "$@"'
)
_RLIMIT_WRAPPER = 'ulimit -v "$1" || exit 126; shift; exec "$@"'


@dataclass(frozen=True, slots=True)
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


class ProcessKernel:
    """A kernel running as a child process group: the `process` runtime's RunningKernel."""

    def __init__(
        self,
        launch: KernelLaunch,
        process: asyncio.subprocess.Process,
        host: str,
        cgroups: tuple[Cgroup, ...] = (),
    ) -> None:
        self._launch = launch
        self._process = process
        self._cgroups = cgroups
        self._info: dict[str, Any] = {"host": host, "pid": process.pid}
        if cgroups:
            self._info["cgroups"] = {
                controller: str(cgroup.path)
                for cgroup in cgroups
                for controller in sorted(cgroup.controllers)
            }
        # Reaped and cleaned up as soon as it ends, whether or not anyone waits yet.
        self._exit = asyncio.create_task(self._reap(), name=f"kernel-{launch.kernel_id}")

    @property
    def info(self) -> Mapping[str, Any]:
        """Host and pid (and its cgroups by controller, when it has any)."""
        return self._info

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
        path = self._launch.work_dir / f"{stream}.log"
        return await asyncio.to_thread(_read_range, path, offset, limit)

    async def list_outputs(self) -> list[OutputFile]:
        """The regular files under the output directory, sorted by name (symlinks skipped)."""
        return await asyncio.to_thread(_list_files, self._launch.output_dir)

    async def read_output(self, name: str) -> bytes:
        """One output file's content; a name leading out of the output directory is refused."""
        return await asyncio.to_thread(_read_inside, self._launch.output_dir, name)

    def _signal_group(self, sig: signal.Signals) -> None:
        # The kernel leads its own session, so its pid is the group id. Once it is reaped the id
        # stays reserved while any member lives; an empty group just reports ESRCH.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, sig)

    async def _reap(self) -> KernelExit:
        code = await self._process.wait()
        self._signal_group(signal.SIGKILL)  # a kernel's orphans must not outlive it
        oom_killed = bool(self._cgroups) and await release_cgroups(self._cgroups)
        cause = "oom_killed" if oom_killed and code != 0 else None
        extra = {"kernel_id": str(self._launch.kernel_id), "exit_code": code, "cause": cause}
        logger.info("runtime.kernel_exited", extra=extra)
        if cause is None:
            return KernelExit(exit_code=code)
        limit_bytes = self._launch.slots.get("mem", 0) // 1000
        message = f"the kernel used more than its memory limit ({limit_bytes} bytes)"
        return KernelExit(exit_code=code, failure_cause=cause, message=message)


class ProcessRuntime:
    """Runs kernels as real child processes on this host (the agent's default runtime)."""

    def __init__(
        self,
        images: Mapping[str, str | Path] | None = None,
        *,
        memory_limits: bool = True,
        host: str | None = None,
    ) -> None:
        clashes = sorted(set(images or {}) & set(BUILTIN_IMAGES))
        if clashes:
            raise ValueError(f"images {clashes} are built in; configure them under other names")
        self._images = {name: Path(location) for name, location in (images or {}).items()}
        self._host = host or socket.gethostname()
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

    def notes(self) -> RuntimeNotes:
        """The limits this runtime can and cannot enforce here, for the agent's startup log."""
        return RuntimeNotes(lines=(self._memory_note, self._cpu_note))

    async def preload(self, launch: KernelLaunch) -> None:
        """Resolve the image and create the kernel's work and output directories."""
        self._image(launch.image)
        try:
            await asyncio.to_thread(launch.output_dir.mkdir, parents=True, exist_ok=True)
        except OSError as exc:
            message = f"cannot create {launch.output_dir}: {exc}"
            raise StageFailure("work_dir_failure", message) from exc

    async def start(self, launch: KernelLaunch) -> ProcessKernel:
        """Spawn the kernel in its own session, logs to files in its work directory."""
        image = self._image(launch.image)
        base = {key: os.environ[key] for key in _BASE_ENV if key in os.environ}
        base.setdefault("PATH", _DEFAULT_PATH)
        env = {**base, **image.variables(base["PATH"]), **launch.environment()}
        argv = image.argv(launch.command)
        if not _executable_exists(argv[0], env.get("PATH", ""), launch.work_dir):
            message = f"{argv[0]!r} is not an executable on the kernel's PATH (image {image.name})"
            raise StageFailure("kernel_start_failure", message, retryable=False)
        try:
            stdout, stderr = _open_logs(launch.work_dir)
        except OSError as exc:
            raise StageFailure("kernel_start_failure", f"cannot open its logs: {exc}") from exc
        cgroups: tuple[Cgroup, ...] = ()
        try:
            argv, cgroups = self._limit(launch, argv)
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                cwd=launch.work_dir,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            await release_cgroups(cgroups)
            message = f"cannot start the kernel: {exc}"
            raise StageFailure("kernel_start_failure", message, retryable=False) from exc
        finally:
            os.close(stdout)
            os.close(stderr)
        extra = {"kernel_id": str(launch.kernel_id), "pid": process.pid, "image": image.name}
        logger.info("runtime.kernel_started", extra=extra)
        return ProcessKernel(launch, process, self._host, cgroups)

    def _limit(self, launch: KernelLaunch, argv: list[str]) -> tuple[list[str], tuple[Cgroup, ...]]:
        """The argv wrapped to apply the kernel's `mem` and `cpu` slots, and its cgroups."""
        limit_bytes = launch.slots.get("mem", 0) // 1000
        # No cgroup carries "memory" when memory limits are off: the probe did not look for it.
        limits = {"memory": limit_bytes, "cpu": launch.slots.get("cpu", 0)}  # cpu: milli-cpus
        wanted = {controller: value for controller, value in limits.items() if value > 0}
        cgroups = self._cgroups.create(f"corral-{launch.kernel_id}", wanted)
        if cgroups:
            procs = [str(cgroup.path / "cgroup.procs") for cgroup in cgroups]
            argv = _wrap(_CGROUP_WRAPPER, [*procs, "--"], argv)
        if self._mode == "rlimit" and limit_bytes > 0 and not launch.devices:
            argv = _wrap(_RLIMIT_WRAPPER, [str(max(1, limit_bytes // 1024))], argv)
        return argv, cgroups

    def _image(self, name: str) -> _Image:
        if name == "python":
            return _Image(name, Path(sys.executable))  # not resolved: a venv's python is a link
        if name == "shell":
            return _Image(name, Path(SHELL), shell=True)
        location = self._images.get(name)
        if location is None:
            known = ", ".join(sorted({*BUILTIN_IMAGES, *self._images}))
            raise StageFailure(
                "image_pull_failure", f"unknown image {name!r}; this agent knows: {known}"
            )
        venv = location if location.is_dir() else None
        image = _Image(name, location / "bin" / "python" if venv else location, venv=venv)
        if not os.access(image.interpreter, os.X_OK) or not image.interpreter.is_file():
            raise StageFailure(
                "image_pull_failure",
                f"image {name!r}: interpreter {image.interpreter} does not exist or is not "
                "executable; fix the agent's image configuration",
            )
        return image


def _wrap(script: str, arguments: list[str], argv: list[str]) -> list[str]:
    return [SHELL, "-c", script, "corral-kernel", *arguments, *argv]


def _executable_exists(name: str, path: str, cwd: Path) -> bool:
    """Whether `name` is an executable where the kernel's exec will look it up."""
    if os.sep not in name:
        return shutil.which(name, path=path) is not None
    candidate = cwd / name  # an absolute name stays itself
    return candidate.is_file() and os.access(candidate, os.X_OK)


def _open_logs(work_dir: Path) -> tuple[int, int]:
    """Fresh stdout.log and stderr.log; files, not pipes, so a chatty kernel never blocks."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    stdout = os.open(work_dir / "stdout.log", flags, 0o644)
    try:
        return stdout, os.open(work_dir / "stderr.log", flags, 0o644)
    except OSError:
        os.close(stdout)
        raise


def _read_range(path: Path, offset: int, limit: int) -> bytes:
    try:
        with path.open("rb") as file:
            file.seek(offset)
            return file.read(limit)
    except FileNotFoundError:
        return b""


def _list_files(root: Path) -> list[OutputFile]:
    paths = (Path(folder, name) for folder, _, names in os.walk(root) for name in names)
    files = [
        OutputFile(path.relative_to(root).as_posix(), path.stat().st_size)
        for path in paths
        if path.is_file() and not path.is_symlink()
    ]
    return sorted(files, key=lambda output: output.name)


def _read_inside(root: Path, name: str) -> bytes:
    base = root.resolve()
    path = (base / name).resolve()
    if path == base or not path.is_relative_to(base):
        raise ValueError(
            f"output name {name!r} leads outside the kernel's output directory; "
            "use a name from list_outputs()"
        )
    return path.read_bytes()


def _where(probe: CgroupProbe, controller: str, how: str, otherwise: str) -> str:
    """Where a kernel's `controller` limit is enforced, for the startup notes (or why not)."""
    parent = probe.parent(controller)
    if parent is not None:
        return f"cgroup v{parent.version} under {parent.path}{how}"
    return f"{otherwise}; cgroups: {probe.reasons.get(controller)}"
