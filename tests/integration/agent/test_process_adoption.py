"""ProcessRuntime adopting real kernels another runtime instance started and let go of.

Each test starts a kernel with one runtime, detaches it (as an agent stopping under the `leave`
policy does) and takes it over with a second runtime, as a restarted agent would.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from corral.agent.runtime import KERNEL_LOST_CAUSE, KernelLaunch, LogMark
from corral.agent.runtime._kernel_record import EXIT_FILE, RECORD_FILE, KernelRecord
from corral.agent.runtime.process import ProcessKernel, ProcessRuntime
from tests.integration.agent._support import eventually, process_gone
from tests.integration.agent.test_process_runtime import make_launch

POLL_S = 0.02
# Prints "more" on SIGUSR2, exits with its first argument on SIGUSR1; writes `ready` first.
WAITER = (
    "import pathlib, signal, sys; "
    "signal.signal(signal.SIGUSR2, lambda *_: print('more', flush=True)); "
    "signal.signal(signal.SIGUSR1, lambda *_: sys.exit(int(sys.argv[1]))); "
    "print('started', flush=True); pathlib.Path('ready').touch(); "
    "[signal.pause() for _ in iter(int, 1)]"
)


@pytest.fixture
async def pids(tmp_path: Path) -> AsyncIterator[list[int]]:
    """Process groups a test leaves behind on purpose: killed at teardown, with every kernel
    still recorded under tmp_path (its wrapper and cgroups too), whether the test passed or not."""
    groups: list[int] = []
    yield groups
    runtime = ProcessRuntime()
    records = await runtime.find_left(tmp_path)
    for left in records:
        await runtime.discard(left)
    for pid in groups:
        if not process_gone(pid):
            os.killpg(pid, signal.SIGKILL)
    wrappers = [left.wrapper.pid for left in records if isinstance(left, KernelRecord)]
    await eventually(lambda: all(map(process_gone, groups + wrappers)), "left processes to end")


async def start_left(tmp_path: Path, launch: KernelLaunch, pids: list[int]) -> ProcessKernel:
    """Start a kernel with a first runtime and let go of it once it is ready."""
    first = ProcessRuntime()
    await first.preload(launch)
    kernel = await first.start(launch)
    pids.append(int(kernel.info["pid"]))
    await eventually((launch.work_dir / "ready").exists, "the kernel is ready")
    kernel.detach()
    return kernel


async def found(tmp_path: Path, runtime: ProcessRuntime) -> KernelRecord:
    """The one record the runtime finds under tmp_path."""
    (left,) = await runtime.find_left(tmp_path)
    assert isinstance(left, KernelRecord)
    return left


def waiter(tmp_path: Path, exit_code: int = 3, **fields: object) -> KernelLaunch:
    """A launch of the WAITER kernel, exiting with `exit_code` on SIGUSR1."""
    launch = make_launch(tmp_path, ("python", "-c", WAITER, str(exit_code)))
    return replace(launch, **fields)  # type: ignore[arg-type]


async def test_a_running_kernel_is_adopted_and_its_exit_code_read(
    tmp_path: Path, pids: list[int]
) -> None:
    """A kernel still running is found, adopted, and its exit 3 reported when it comes."""
    launch = waiter(tmp_path, devices=(1, 3))
    started = await start_left(tmp_path, launch, pids)
    runtime = ProcessRuntime(adopted_poll_s=POLL_S)
    left = await found(tmp_path, runtime)
    assert (left.kernel_id, left.devices) == (launch.kernel_id, (1, 3))
    assert left.wrapper.alive() and left.kernel.alive()
    adopted = await runtime.adopt(left, launch)
    assert adopted.info == started.info
    os.kill(int(adopted.info["pid"]), signal.SIGUSR1)
    exit = await adopted.wait()
    assert (exit.exit_code, exit.failure_cause) == (3, None)
    assert await adopted.read_log("stdout", 0, 100) == b"started\n"


async def test_a_kernel_that_ended_unwatched_reports_its_real_exit(
    tmp_path: Path, pids: list[int]
) -> None:
    """A kernel that ended while no agent watched: its exit code comes from the exit file."""
    launch = waiter(tmp_path, exit_code=0)
    started = await start_left(tmp_path, launch, pids)
    os.kill(int(started.info["pid"]), signal.SIGUSR1)
    await eventually((launch.work_dir / EXIT_FILE).exists, "the wrapper recorded the exit")
    runtime = ProcessRuntime(adopted_poll_s=POLL_S)
    adopted = await runtime.adopt(await found(tmp_path, runtime), launch)
    exit = await adopted.wait()
    assert (exit.exit_code, exit.failure_cause) == (0, None)


async def test_a_recycled_pid_is_not_taken_for_the_kernel(tmp_path: Path, pids: list[int]) -> None:
    """Kernel and wrapper gone without a status, their pid now a stranger's: lost, and spared."""
    launch = waiter(tmp_path)
    started = await start_left(tmp_path, launch, pids)
    runtime = ProcessRuntime(adopted_poll_s=POLL_S)
    record = await found(tmp_path, runtime)
    os.kill(record.wrapper.pid, signal.SIGKILL)  # first: it would record the kernel's death
    os.killpg(int(started.info["pid"]), signal.SIGKILL)
    await eventually(lambda: process_gone(record.kernel.pid), "the kernel to end")
    stranger = await asyncio.create_subprocess_exec("sleep", "600", start_new_session=True)
    pids.append(stranger.pid)
    pid_reused = replace(
        record,
        wrapper=replace(record.wrapper, pid=stranger.pid),
        kernel=replace(record.kernel, pid=stranger.pid),
    )
    pid_reused.write()
    adopted = await runtime.adopt(await found(tmp_path, runtime), launch)
    exit = await adopted.wait()
    assert (exit.exit_code, exit.failure_cause) == (None, KERNEL_LOST_CAUSE)
    await adopted.terminate(grace_s=1)
    assert not process_gone(stranger.pid), "the stranger holding the recorded pid was killed"
    stranger.kill()
    await stranger.wait()


async def test_terminating_an_adopted_kernel_ends_its_whole_group(
    tmp_path: Path, pids: list[int]
) -> None:
    """terminate: SIGTERM to the adopted kernel's group ends it and every child it started."""
    script = "sleep 600 & echo $! >> pids; sleep 600 & echo $! >> pids; touch ready; wait"
    launch = make_launch(tmp_path, (script,), image="shell")
    await start_left(tmp_path, launch, pids)
    children = [int(pid) for pid in (launch.work_dir / "pids").read_text().split()]
    runtime = ProcessRuntime(adopted_poll_s=POLL_S)
    adopted = await runtime.adopt(await found(tmp_path, runtime), launch)
    assert (await adopted.terminate(grace_s=5)).exit_code == -signal.SIGTERM
    await eventually(lambda: all(map(process_gone, children)), f"children {children} to end")
    for cgroup in adopted.info.get("cgroups", {}).values():
        assert not await asyncio.to_thread(Path(cgroup).exists)


async def test_discarding_kills_the_group_and_forgets_the_kernel(
    tmp_path: Path, pids: list[int]
) -> None:
    """A left kernel no longer assigned: its group and wrapper are killed, its traces removed."""
    launch = waiter(tmp_path)
    started = await start_left(tmp_path, launch, pids)
    runtime = ProcessRuntime()
    record = await found(tmp_path, runtime)
    await runtime.discard(record)
    await eventually(lambda: process_gone(record.kernel.pid), "the kernel to be killed")
    await eventually(lambda: process_gone(record.wrapper.pid), "the wrapper to be killed")
    assert not (launch.work_dir / RECORD_FILE).exists()
    assert not (launch.work_dir / EXIT_FILE).exists()
    for cgroup in started.info.get("cgroups", {}).values():
        assert not await asyncio.to_thread(Path(cgroup).exists)
    assert await runtime.find_left(tmp_path) == []


async def test_log_marks_are_kept_in_the_record_for_the_adopter(
    tmp_path: Path, pids: list[int]
) -> None:
    """Marks a kernel saved are what the adopted kernel starts from."""
    launch = waiter(tmp_path)
    started = await start_left(tmp_path, launch, pids)
    assert started.log_marks == {}
    marks = {"stdout": LogMark(3, 8), "stderr": LogMark(0, 0)}
    await started.save_log_marks(marks)
    runtime = ProcessRuntime(adopted_poll_s=POLL_S)
    adopted = await runtime.adopt(await found(tmp_path, runtime), launch)
    assert adopted.log_marks == marks
    await adopted.terminate(grace_s=5)


async def test_an_unreadable_record_is_skipped(tmp_path: Path) -> None:
    """A record that is not JSON is left alone; the others are found."""
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / RECORD_FILE).write_text("{not json")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / RECORD_FILE).write_text(json.dumps({"version": 99}))
    assert await ProcessRuntime().find_left(tmp_path) == []
    assert await ProcessRuntime().find_left(tmp_path / "missing") == []
