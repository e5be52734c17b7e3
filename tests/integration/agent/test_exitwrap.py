"""The exit-status wrapper as a real process: the status it leaves, signals it passes on, and a
kernel that runs as it would without it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from corral.agent.runtime import _exitwrap
from tests.integration.agent._support import eventually, process_gone

WRAPPER = (sys.executable, "-I", "-S", _exitwrap.__file__)
# Exits with 7 on SIGTERM or SIGINT, once it said it is ready.
_TRAPS = (
    "import pathlib, signal, sys; "
    "[signal.signal(s, lambda *_: sys.exit(7)) for s in (signal.SIGTERM, signal.SIGINT)]; "
    "pathlib.Path('ready').touch(); signal.pause()"
)


@dataclass
class Wrapped:
    """A wrapper process, what it said on its status pipe, and its files."""

    process: asyncio.subprocess.Process
    status: list[str]
    work_dir: Path

    @property
    def kernel_pid(self) -> int:
        assert self.status[0] == "started", self.status
        return int(self.status[1])

    def exit_status(self) -> object:
        """What the exit file holds (None when there is none)."""
        path = self.work_dir / "exit.json"
        return json.loads(path.read_text()) if path.exists() else None


Wrap = Callable[..., Awaitable[Wrapped]]


@pytest.fixture
async def wrap(tmp_path: Path) -> AsyncIterator[Wrap]:
    """Start commands under the wrapper; whatever still runs is killed at teardown."""
    started: list[Wrapped] = []

    async def start(*argv: str, env: Mapping[str, str] | None = None) -> Wrapped:
        status_r, status_w = os.pipe()
        process = await asyncio.create_subprocess_exec(
            *WRAPPER,
            str(status_w),
            str(tmp_path / "exit.json"),
            "--",
            *argv,
            cwd=tmp_path,
            env=env if env is not None else {"PATH": os.environ["PATH"]},
            stdout=asyncio.subprocess.PIPE,
            pass_fds=(status_w,),
            start_new_session=True,
        )
        os.close(status_w)
        with os.fdopen(status_r, "rb") as status:
            line = await asyncio.to_thread(status.read)
        started.append(Wrapped(process, line.decode().split(), tmp_path))
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
    assert wrapped.status[0] == "started" and len(wrapped.status) == 4
    assert await wrapped.process.wait() == code
    assert wrapped.exit_status() == {"exit_code": code}


async def test_a_death_by_signal_is_written_as_minus_the_signal(wrap: Wrap) -> None:
    """A kernel killed by SIGUSR1 leaves -10, and the wrapper ends by the same signal."""
    wrapped = await wrap("sh", "-c", "kill -USR1 $$")
    assert await wrapped.process.wait() == -signal.SIGUSR1
    assert wrapped.exit_status() == {"exit_code": -signal.SIGUSR1}


async def test_sigkill_to_the_kernels_group_spares_the_wrapper(wrap: Wrap) -> None:
    """The wrapper is outside the kernel's group: killing the group still leaves a status."""
    wrapped = await wrap("sh", "-c", "touch ready; exec sleep 600")
    await eventually((wrapped.work_dir / "ready").exists, "the kernel runs")
    os.killpg(wrapped.kernel_pid, signal.SIGKILL)
    assert await wrapped.process.wait() == -signal.SIGKILL
    assert wrapped.exit_status() == {"exit_code": -signal.SIGKILL}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_sigterm_and_sigint_to_the_wrapper_reach_the_kernel(
    wrap: Wrap, sig: signal.Signals
) -> None:
    """A signal sent to the wrapper alone is passed on: the kernel's handler exits 7."""
    wrapped = await wrap(sys.executable, "-c", _TRAPS)
    await eventually((wrapped.work_dir / "ready").exists, "the kernel handles the signals")
    wrapped.process.send_signal(sig)
    assert await wrapped.process.wait() == 7
    assert wrapped.exit_status() == {"exit_code": 7}


async def test_the_kernel_gets_exactly_the_environment_it_was_given(wrap: Wrap) -> None:
    """No variable is added (not even the LC_CTYPE Python adds to its own for a C locale)."""
    env = {"PATH": os.environ["PATH"], "LANG": "C", "ODD": "a=b c"}
    wrapped = await wrap("cat", "/proc/self/environ", env=env)
    assert wrapped.process.stdout is not None
    block = await wrapped.process.stdout.read()
    assert await wrapped.process.wait() == 0
    assert sorted(block.decode().split("\0")[:-1]) == sorted(f"{k}={v}" for k, v in env.items())


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
    assert wrapped.process.stdout is not None
    pid, group_and_session, blocked, ignored = (await wrapped.process.stdout.read()).split(b"\n")[
        :4
    ]
    assert await wrapped.process.wait() == 0
    assert int(pid) == wrapped.kernel_pid != wrapped.process.pid
    assert group_and_session.split() == [pid, pid]
    assert blocked.split() == [b"SigBlk:", b"0000000000000000"]
    assert ignored.strip() == await _ignored_by_a_plain_child()
    mask = int(ignored.split()[1], 16)
    assert not mask & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1))


async def test_a_command_that_cannot_be_run_is_reported_on_the_status_pipe(wrap: Wrap) -> None:
    """exec failing: `failed <errno> <why>`, exit 127 and no exit file."""
    wrapped = await wrap("corral-no-such-program")
    assert wrapped.status[:2] == ["failed", "2"]
    assert "corral-no-such-program" in " ".join(wrapped.status)
    assert await wrapped.process.wait() == _exitwrap.EXEC_FAILED
    assert wrapped.exit_status() is None
