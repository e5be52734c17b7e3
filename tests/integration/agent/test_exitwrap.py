"""The exit-status wrapper as a real process, started as the runtime starts it: the status it
leaves, signals it survives, and a kernel that runs as it would without it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral.agent.runtime import _exitwrap
from corral.agent.runtime._children import Child, spawn
from tests.integration.agent._support import eventually, process_gone

SETSID = _exitwrap.find_setsid()
# Exits with 7 on SIGTERM or SIGINT, once it said it is ready.
_TRAPS = (
    "import pathlib, signal, sys; "
    "[signal.signal(s, lambda *_: sys.exit(7)) for s in (signal.SIGTERM, signal.SIGINT)]; "
    "pathlib.Path('ready').touch(); signal.pause()"
)


@dataclass
class Wrapped:
    """A wrapper process, what it said on its status pipe, and its files."""

    process: Child
    status: list[str]
    work_dir: Path
    stdout: Path

    @property
    def kernel_pid(self) -> int:
        assert self.status[0] == "started", self.status
        return int(self.status[1])

    def output(self) -> bytes:
        """What the kernel wrote to its stdout."""
        return self.stdout.read_bytes()

    def exit_status(self) -> object:
        """What the exit file holds (None when there is none)."""
        path = self.work_dir / "exit.json"
        return json.loads(path.read_text()) if path.exists() else None


Wrap = Callable[..., Awaitable[Wrapped]]

# glibc's posix_spawn leaves its own two signals (32, 33) ignored in the child; glibc programs
# install their handlers for them at start (see `_exitwrap`).
GLIBC_INTERNAL_SIGNALS = 1 << 31 | 1 << 32


@pytest.fixture
async def wrap(tmp_path: Path) -> AsyncIterator[Wrap]:
    """Start commands under the wrapper; whatever still runs is killed at teardown."""
    started: list[Wrapped] = []

    async def start(
        *argv: str,
        env: Mapping[str, str] | None = None,
        cgroup_procs: Sequence[str] = (),
        address_space_kib: int | None = None,
    ) -> Wrapped:
        status_r, status_w = os.pipe()
        stdout = tmp_path / f"stdout-{len(started)}.log"
        out = os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        wrapped = _exitwrap.argv(
            str(tmp_path),
            str(tmp_path / "exit.json"),
            SETSID,
            list(argv),
            cgroup_procs=cgroup_procs,
            address_space_kib=address_space_kib,
        )
        process = spawn(
            wrapped,
            env if env is not None else {"PATH": os.environ["PATH"]},
            {1: out, 2: out, _exitwrap.STATUS_FD: status_w},
            default_signals=_exitwrap.RESTORED,
        )
        os.close(status_w)
        os.close(out)
        with os.fdopen(status_r, "rb") as status:
            line = await asyncio.to_thread(status.readline)
        started.append(Wrapped(process, line.decode().split(), tmp_path, stdout))
        return started[-1]

    yield start
    for wrapped in started:
        if wrapped.status[:1] == ["started"] and not process_gone(wrapped.kernel_pid):
            os.killpg(wrapped.kernel_pid, signal.SIGKILL)
        await wrapped.process.wait()


@pytest.mark.parametrize("code", [0, 3])
async def test_an_exit_code_is_written_and_the_wrapper_exits_with_it(wrap: Wrap, code: int) -> None:
    """A kernel exiting with 0 or 3 leaves that code in the exit file; the wrapper mirrors it."""
    wrapped = await wrap("sh", "-c", f"exit {code}")
    assert wrapped.status[0] == "started" and len(wrapped.status) == 2
    assert await wrapped.process.wait() == code
    assert wrapped.exit_status() == {"exit_code": code}


async def test_a_death_by_signal_is_written_as_minus_the_signal(wrap: Wrap) -> None:
    """A kernel killed by SIGUSR1 leaves -10, and the wrapper ends by the same signal; the
    shell's own word about it ("User defined signal 1") stays out of the kernel's log."""
    wrapped = await wrap("sh", "-c", "echo before; kill -USR1 $$")
    assert await wrapped.process.wait() == -signal.SIGUSR1
    assert wrapped.exit_status() == {"exit_code": -signal.SIGUSR1}
    assert wrapped.output() == b"before\n"


async def test_an_exit_code_above_128_reads_as_a_death_by_signal(wrap: Wrap) -> None:
    """A shell reports a death by signal N as 128 + N: exit 137 is recorded as -9 (SIGKILL),
    and a code a signal cannot explain (200) stays itself."""
    wrapped = await wrap("sh", "-c", "exit 137")
    assert await wrapped.process.wait() == -signal.SIGKILL
    assert wrapped.exit_status() == {"exit_code": -signal.SIGKILL}
    wrapped = await wrap("sh", "-c", "exit 200")
    assert await wrapped.process.wait() == 200
    assert wrapped.exit_status() == {"exit_code": 200}


async def test_sigkill_to_the_kernels_group_spares_the_wrapper(wrap: Wrap) -> None:
    """The wrapper is outside the kernel's group: killing the group still leaves a status."""
    wrapped = await wrap("sh", "-c", "touch ready; exec sleep 600")
    await eventually((wrapped.work_dir / "ready").exists, "the kernel runs")
    os.killpg(wrapped.kernel_pid, signal.SIGKILL)
    assert await wrapped.process.wait() == -signal.SIGKILL
    assert wrapped.exit_status() == {"exit_code": -signal.SIGKILL}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_sigterm_and_sigint_to_the_wrapper_alone_leave_it_recording(
    wrap: Wrap, sig: signal.Signals
) -> None:
    """A signal sent to the wrapper alone ends neither it nor the kernel: the kernel's status is
    still recorded when the kernel's group is signalled."""
    wrapped = await wrap(sys.executable, "-c", _TRAPS)
    await eventually((wrapped.work_dir / "ready").exists, "the kernel handles the signals")
    wrapped.process.send_signal(sig)
    await asyncio.sleep(0)  # nothing to wait for: the wrapper must simply still be there
    assert not process_gone(wrapped.process.pid) and not process_gone(wrapped.kernel_pid)
    os.killpg(wrapped.kernel_pid, signal.SIGTERM)
    assert await wrapped.process.wait() == 7
    assert wrapped.exit_status() == {"exit_code": 7}


async def test_the_kernel_gets_exactly_the_environment_it_was_given(wrap: Wrap) -> None:
    """No variable is added but PWD, naming where it starts (no OLDPWD from the wrapper's `cd`)."""
    env = {"PATH": os.environ["PATH"], "LANG": "C", "ODD": "a=b c"}
    wrapped = await wrap("cat", "/proc/self/environ", env=env)
    assert await wrapped.process.wait() == 0
    block = wrapped.output()
    expected = {**env, "PWD": str(wrapped.work_dir)}
    given = sorted(block.decode().split("\0")[:-1])
    assert given == sorted(f"{k}={v}" for k, v in expected.items())


async def _ignored_by_a_plain_child() -> bytes:
    """The SigIgn line of a process started directly, as subprocess starts one: what the test
    run itself passes on (a CI shell may ignore signals of its own), SIGPIPE and SIGXFSZ reset."""
    child = await asyncio.create_subprocess_exec(
        "grep", "^SigIgn", "/proc/self/status", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await child.communicate()
    return out.strip()


async def test_the_kernel_leads_its_own_session_with_default_signals(wrap: Wrap) -> None:
    """pid = process group = session, apart from the wrapper; nothing blocked, and nothing
    ignored beyond what a kernel started directly would inherit (SIGPIPE is not left ignored)."""
    script = 'echo $$; cut -d" " -f5,6 /proc/$$/stat; grep -E "^Sig(Ign|Blk)" /proc/self/status'
    wrapped = await wrap("sh", "-c", script)
    assert await wrapped.process.wait() == 0
    pid, group_and_session, blocked, ignored = wrapped.output().split(b"\n")[:4]
    assert int(pid) == wrapped.kernel_pid != wrapped.process.pid
    assert group_and_session.split() == [pid, pid]
    assert blocked.split() == [b"SigBlk:", b"0000000000000000"]
    # glibc's internal signals compared on neither side: posix_spawn leaves them as they were,
    # and the test process may ignore them (an xdist worker does).
    mask = int(ignored.split()[1], 16) & ~GLIBC_INTERNAL_SIGNALS
    plain = int((await _ignored_by_a_plain_child()).split()[1], 16) & ~GLIBC_INTERNAL_SIGNALS
    assert mask == plain
    assert not mask & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1))


async def test_a_command_that_cannot_be_run_is_reported_on_the_status_pipe(wrap: Wrap) -> None:
    """A command not found: `failed <errno> <why>` instead of `started`, and exit 127."""
    wrapped = await wrap("corral-no-such-program")
    assert wrapped.status[:2] == ["failed", "2"]
    assert "corral-no-such-program" in " ".join(wrapped.status)
    assert await wrapped.process.wait() == _exitwrap.EXEC_FAILED


async def test_the_kernel_enters_its_cgroups_and_address_limit_before_it_runs(
    wrap: Wrap, tmp_path: Path
) -> None:
    """The kernel's own pid is written to each `cgroup.procs` file (plain files stand in for
    them here) and its RLIMIT_AS is set, before the command runs."""
    procs = [tmp_path / "memory.procs", tmp_path / "cpu.procs"]
    wrapped = await wrap(
        "sh", "-c", "ulimit -v", cgroup_procs=[str(p) for p in procs], address_space_kib=262144
    )
    assert await wrapped.process.wait() == 0
    assert [p.read_text() for p in procs] == [f"{wrapped.kernel_pid}\n"] * 2
    assert wrapped.output() == b"262144\n"


async def test_a_cgroup_the_kernel_cannot_enter_is_reported_and_nothing_runs(
    wrap: Wrap, tmp_path: Path
) -> None:
    """`failed - <why>` names the cgroup; the command never runs; the wrapper exits 126."""
    missing = tmp_path / "gone" / "cgroup.procs"
    wrapped = await wrap("touch", "ran", cgroup_procs=[str(missing)])
    assert wrapped.status[:2] == ["failed", _exitwrap.NO_ERRNO]
    assert " ".join(wrapped.status[2:]) == f"cannot move the kernel into its cgroup ({missing})"
    assert await wrapped.process.wait() == 126
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("told", [True, False])
async def test_a_staged_kernel_waits_for_go_and_ends_unstarted_when_its_pipe_closes(
    tmp_path: Path, told: bool
) -> None:
    """Staged, the kernel's side says `ready <pid>` and waits: a line on the go pipe lets it
    run (`started` with the same pid); the pipe closing instead (as when the agent dies) ends
    it with ABANDONED, its command never run."""
    status_r, status_w = os.pipe()
    go_r, go_w = os.pipe()
    wrapped = _exitwrap.argv(
        str(tmp_path), str(tmp_path / "exit.json"), SETSID, ["touch", "ran"], staged=True
    )
    fds = {_exitwrap.STATUS_FD: status_w, _exitwrap.GO_FD: go_r}
    process = spawn(wrapped, {"PATH": os.environ["PATH"]}, fds)
    os.close(status_w)
    os.close(go_r)
    with os.fdopen(status_r, "rb") as status:
        ready = (await asyncio.to_thread(status.readline)).decode().split()
        assert ready[0] == "ready"
        assert not (tmp_path / "ran").exists()
        if told:
            os.write(go_w, b"go\n")
        os.close(go_w)
        after = (await asyncio.to_thread(status.readline)).decode().split()
    if told:
        assert after == ["started", ready[1]]
        assert await process.wait() == 0
        assert (tmp_path / "ran").exists()
    else:
        assert after == []
        assert await process.wait() == _exitwrap.ABANDONED
        assert not (tmp_path / "ran").exists()
