"""Runs a kernel as its child and leaves the kernel's exit status in a file (`process` runtime).

The agent starts it as `python -I -S _exitwrap.py STATUS_FD EXIT_FILE -- ARGV...` (by path, so
only the standard library is needed). It forks; the child makes a session of its own, so the
kernel leads its process group exactly as it would without the wrapper, and execs ARGV. The
wrapper writes one line to STATUS_FD: `started <pid> <wrapper start> <kernel start>` (start
times as /proc/<pid>/stat field 22 gives them) or `failed <errno> <message>`, and closes it.
SIGTERM and SIGINT sent to the wrapper are passed on to the kernel. When the kernel ends, its
status is written to EXIT_FILE through a temporary file and a rename (`{"exit_code": N}`,
negative: killed by signal -N) and the wrapper ends the same way, so a parent still waiting
sees the kernel's own status.

Why a wrapper: an agent restarted under the `leave` policy is not the kernel's parent and cannot
wait for it; the file tells it how the kernel ended. The wrapper stays outside the kernel's
process group and cgroups, so SIGKILL to the group, or an OOM kill of the whole cgroup, still
leaves it to write the status. It imports little (no json, no pathlib): it starts before every
kernel.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import sys
from typing import NoReturn

FORWARDED = (signal.SIGTERM, signal.SIGINT)
# Python ignores these at start-up, and an ignored signal stays ignored across exec: the kernel
# gets the defaults back, as subprocess gives its children.
RESTORED = (signal.SIGPIPE, signal.SIGXFSZ)
EXEC_FAILED = 127
_STAT_START_FIELD = 19  # field 22 of /proc/<pid>/stat, counted after the ")" ending field 2


def main(argv: list[str]) -> int:
    """Run `KERNEL_ARGV` as described in the module docstring; the kernel's exit code."""
    if len(argv) < 4 or argv[2] != "--":
        print("usage: _exitwrap.py STATUS_FD EXIT_FILE -- ARGV...", file=sys.stderr)
        return 2
    status_fd, exit_file, command = int(argv[0]), argv[1], argv[3:]
    os.set_inheritable(status_fd, False)
    # Python may add LC_CTYPE to its own environment at start-up (PEP 538, for a C locale): the
    # kernel gets the environment exactly as the agent gave it, read back from the kernel's copy.
    environment = _initial_environment()
    child: int | None = None

    def forward(signum: int, _frame: object) -> None:
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)
    errors_r, errors_w = os.pipe()  # close-on-exec: EOF without a word means exec worked
    # Blocked across the fork: the child resets the dispositions before any can reach it.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    pid = os.fork()
    if pid == 0:
        os.close(errors_r)
        _exec_kernel(command, environment, errors_w)
    os.close(errors_w)
    child = pid
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    failure = _read_all(errors_r)
    if failure:
        os.waitpid(pid, 0)
        _tell(status_fd, f"failed {failure.decode(errors='replace')}")
        return EXEC_FAILED
    _tell(status_fd, f"started {pid} {_start_ticks(os.getpid())} {_start_ticks(pid)}")
    # Learn that the kernel ended before reaping it: from then on its pid may be reused, and a
    # signal forwarded to it could reach a stranger.
    os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    child = None
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    try:
        _write_exit_file(exit_file, code)
    except OSError as exc:
        message = f"corral: cannot record the kernel's exit status in {exit_file}: {exc}"
        print(message, file=sys.stderr)
    return _end_like(code)


def _exec_kernel(command: list[str], environment: dict[bytes, bytes], errors_w: int) -> NoReturn:
    """In the forked child: a session of its own, default signals, then the kernel."""
    try:
        os.setsid()
        for sig in (*FORWARDED, *RESTORED):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
        os.execvpe(command[0], command, environment)
    except OSError as exc:
        os.write(errors_w, f"{exc.errno or 0} {exc.strerror or exc}: {command[0]}".encode())
    finally:
        os._exit(EXEC_FAILED)


def _initial_environment() -> dict[bytes, bytes]:
    try:
        with open("/proc/self/environ", "rb") as file:
            raw = file.read()
    except OSError:
        return dict(os.environb)
    pairs = (entry.split(b"=", 1) for entry in raw.split(b"\0") if b"=" in entry)
    return {name: value for name, value in pairs}


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _tell(fd: int, line: str) -> None:
    os.write(fd, f"{line}\n".encode())
    os.close(fd)


def _start_ticks(pid: int) -> str:
    """The process's start time, or "-" where /proc cannot tell (it is then never adopted)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
        return str(int(stat.rsplit(b")", 1)[1].split()[_STAT_START_FIELD]))
    except (OSError, ValueError, IndexError):
        return "-"


def _write_exit_file(path: str, code: int) -> None:
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="ascii") as file:
        file.write(f'{{"exit_code": {code}}}\n')
    os.replace(temporary, path)


def _end_like(code: int) -> int:
    """Exit as the kernel did: with its code, or killed by its signal (without a core dump)."""
    if code >= 0:
        return code
    sig = -code
    if sig not in (signal.SIGKILL, signal.SIGSTOP):  # those two cannot be handled anyway
        signal.signal(sig, signal.SIG_DFL)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
    os.kill(os.getpid(), sig)
    return 128 + sig  # a signal whose default is not to end the process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
