"""The process runtime's spare, with real processes and (where the host has them) real cgroups:
a lone kernel's staging takes it, the kernel runs as one staged the ordinary way would, a new
spare follows, and nothing of a spare outlives the runtime or a killed agent."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.agent.runtime import KernelLaunch, StageFailure
from corral.agent.runtime import _exitwrap as exitwrap
from corral.agent.runtime._kernel_record import EXIT_FILE, KernelRecord
from corral.agent.runtime.process import SPARE_PREFIX, ProcessKernel, ProcessRuntime, _Spawned
from tests.integration.agent._support import eventually, process_gone
from tests.integration.agent.test_process_runtime import (
    MIB,
    WRAPPER_LIKE,
    cpu_quota_of,
    make_launch,
    require_cpu_cgroups,
)

# Everything a kernel can tell of how it was started: its environment (one variable a line, as
# the shell quotes nothing here), directory, session and group, blocked and ignored signals,
# address space limit; then a line on stderr and exit 3.
REPORT = (
    "cat /proc/self/environ | tr '\\0' '\\n' | sort; pwd; cut -d' ' -f5,6 /proc/$$/stat; "
    "grep -E '^Sig(Blk|Ign)' /proc/self/status; ulimit -v; echo oops >&2; exit 3"
)
# Values that differ from one kernel to the next, whichever way it started.
PER_KERNEL = (
    *("CORRAL_KERNEL_ID", "CORRAL_SESSION_ID", "CORRAL_OUTPUT_DIR", "CORRAL_WORKDIR"),
    "MASTER_PORT",
)


@pytest.fixture
async def spared() -> AsyncIterator[ProcessRuntime]:
    """An opened runtime that keeps a spare, its spare made; closed at teardown."""
    runtime = ProcessRuntime(spare=True)
    await runtime.open()
    await spare_of(runtime)
    yield runtime
    await runtime.close()


async def spare_of(runtime: ProcessRuntime) -> _Spawned:
    """The runtime's spare, once made."""
    making = runtime._spare
    assert making is not None, "no spare is on its way"
    spare = await making
    assert spare is not None, "the spare could not be made"
    return spare


async def next_spare(runtime: ProcessRuntime, taken: _Spawned) -> _Spawned:
    """The spare made after `taken` was."""
    await eventually(lambda: runtime._spare is not None, "a new spare to be on its way")
    spare = await spare_of(runtime)
    assert spare is not taken and spare.wrapper.pid != taken.wrapper.pid
    return spare


async def staged_and_started(runtime: ProcessRuntime, launch: KernelLaunch) -> ProcessKernel:
    """Preload, stage and start a lone kernel, as the agent's worker does."""
    await runtime.preload(launch)
    await runtime.stage(launch)
    return await runtime.start(launch)


def seen(report: str, kernel: ProcessKernel, launch: KernelLaunch) -> list[str]:
    """A REPORT's lines with the kernel's own values (ids, directory, pid) put back as names."""
    pid = str(kernel.info["pid"])
    lines = []
    for line in report.splitlines():
        name, _, _ = line.partition("=")
        line = f"{name}=<own>" if name in PER_KERNEL else line
        line = "<pid> <pid>" if line == f"{pid} {pid}" else line  # its own group and session
        lines.append(line.replace(str(launch.work_dir), "<work_dir>"))
    return lines


async def test_a_lone_kernel_takes_the_spare_and_runs_as_an_ordinarily_staged_one(
    spared: ProcessRuntime, tmp_path: Path
) -> None:
    """Staging a lone kernel takes the spare (no process is spawned for it); the kernel sees
    exactly what a kernel staged the ordinary way sees (environment, with a value a shell would
    mangle unquoted; directory; its own session and group; signals; limits), its logs and exit
    status are the same, and its record names its wrapper and kernel; a new spare follows."""
    spare = await spare_of(spared)
    env = {"ODD": "a=b c'\"$x `y` \\n", "EMPTY": "", **{n: f"user's {n}" for n in WRAPPER_LIKE}}
    launch = make_launch(tmp_path, (REPORT,), image="shell", env=env)
    kernel = await staged_and_started(spared, launch)
    assert kernel.info["pid"] != spare.wrapper.pid
    assert spared._staged == {}
    exit = await kernel.wait()
    record = KernelRecord.read(launch.work_dir / ".corral-kernel.json")
    assert record.wrapper.pid == spare.wrapper.pid  # the spare's wrapper became the kernel's
    assert not (launch.work_dir / ".corral-start.sh").exists()

    ordinary = ProcessRuntime(spare=False)
    other = make_launch(tmp_path, (REPORT,), image="shell", env=env)
    await ordinary.preload(other)
    await ordinary.stage(other)
    assert ordinary._staged  # staged the ordinary way, for the same comparison
    reference = await ordinary.start(other)
    reference_exit = await reference.wait()

    assert (exit.exit_code, reference_exit.exit_code) == (3, 3)
    report = (await kernel.read_log("stdout", 0, 1 << 20)).decode()
    expected = (await reference.read_log("stdout", 0, 1 << 20)).decode()
    assert seen(report, kernel, launch) == seen(expected, reference, other)
    assert f"ODD={env['ODD']}" in report and "EMPTY=" in report.splitlines()
    assert {f"{n}=user's {n}" for n in WRAPPER_LIKE} <= set(report.splitlines())
    assert "<pid> <pid>" in seen(report, kernel, launch)  # leads its own group and session
    assert await kernel.read_log("stderr", 0, 100) == b"oops\n"
    assert (launch.work_dir / EXIT_FILE).read_text() == '{"exit_code": 3}\n'
    await next_spare(spared, spare)


async def test_the_spare_waits_in_cgroups_that_become_the_kernels_with_its_limits(
    spared: ProcessRuntime, tmp_path: Path
) -> None:
    """The spare's processes wait in cgroups of their own before any kernel comes; taken, the
    cgroups carry the kernel's limits (on v1 also its name), the kernel runs in them, and they
    are removed when it ends."""
    require_cpu_cgroups(spared)
    spare = await spare_of(spared)
    cpu = next(c for c in spare.cgroups if "cpu" in c.controllers)
    assert cpu.path.name.startswith(SPARE_PREFIX)
    assert (cpu.path / "cgroup.procs").read_text().split()  # the kernel's side is in already
    script = "touch ready; exec sleep 600"
    slots = {"cpu": 1500, "mem": 256 * MIB * 1000}
    launch = make_launch(tmp_path, (script,), image="shell", slots=slots)
    kernel = await staged_and_started(spared, launch)
    await eventually((launch.work_dir / "ready").exists, "the kernel runs")
    cgroup = Path(kernel.info["cgroups"]["cpu"])
    if cpu.version == 1:
        assert cgroup.name == f"corral-{launch.kernel_id}"
    assert str(kernel.info["pid"]) in (cgroup / "cgroup.procs").read_text().split()
    assert cpu_quota_of(cgroup) == "150000 100000"
    if spared.memory_limit_mode == "cgroup":
        memory = Path(kernel.info["cgroups"]["memory"])
        limit_file = "memory.max" if (memory / "memory.max").exists() else "memory.limit_in_bytes"
        assert int((memory / limit_file).read_text()) == 256 * MIB
    await kernel.terminate(grace_s=5)
    cgroups = [Path(path) for path in kernel.info["cgroups"].values()]
    assert not any(await asyncio.to_thread(lambda: [path.exists() for path in cgroups]))


async def test_a_spare_killed_while_it_waits_is_not_taken(
    spared: ProcessRuntime, tmp_path: Path
) -> None:
    """A spare whose processes were killed (an admin, the OOM killer) is given up when a kernel
    would take it: the kernel is staged the ordinary way and runs, and a new spare follows."""
    spare = await spare_of(spared)
    cgroups = [cgroup.path for cgroup in spare.cgroups]
    children = Path(f"/proc/{spare.wrapper.pid}/task/{spare.wrapper.pid}/children")
    kernel_side = int((await asyncio.to_thread(children.read_text)).split()[0])
    os.kill(kernel_side, signal.SIGKILL)  # waiting for its start script
    await eventually(lambda: process_gone(kernel_side), "the spare's kernel side to end")
    launch = make_launch(tmp_path, ("echo ran",), image="shell")
    await spared.preload(launch)
    await spared.stage(launch)
    staged = spared._staged[launch.kernel_id]
    assert staged is not spare and staged.wrapper.pid != spare.wrapper.pid
    assert not any(path.exists() for path in cgroups)
    kernel = await spared.start(launch)
    assert (await kernel.wait()).exit_code == 0
    assert await kernel.read_log("stdout", 0, 100) == b"ran\n"
    await next_spare(spared, spare)


async def test_a_kernel_the_spare_cannot_give_its_environment_leaves_it_for_the_next(
    spared: ProcessRuntime, tmp_path: Path
) -> None:
    """A variable the shell keeps for itself (IFS) makes the kernel stage the ordinary way (a
    spare would export it where the wrappers' shells do not); the spare stays for the next."""
    spare = await spare_of(spared)
    launch = make_launch(tmp_path, ("true",), image="shell", env={"IFS": ":"})
    await spared.preload(launch)
    await spared.stage(launch)
    assert spared._staged[launch.kernel_id] is not spare
    kernel = await spared.start(launch)
    assert (await kernel.wait()).exit_code == 0
    assert await spare_of(spared) is spare
    assert not exitwrap.can_take_spare({"IFS": ":"})
    assert not exitwrap.can_take_spare({"A.B": "1"})
    assert exitwrap.can_take_spare({"PWD": "/x", "A_1": "a b"})


async def test_close_ends_the_spare_and_none_is_made_again(tmp_path: Path) -> None:
    """Closed, the runtime's spare ends and its cgroups go; a kernel staged after that is
    staged the ordinary way, and no new spare comes."""
    runtime = ProcessRuntime(spare=True)
    await runtime.open()
    spare = await spare_of(runtime)
    await runtime.close()
    assert process_gone(spare.wrapper.pid)
    assert not any(cgroup.path.exists() for cgroup in spare.cgroups)
    launch = make_launch(tmp_path, ("true",), image="shell")
    kernel = await staged_and_started(runtime, launch)
    assert (await kernel.wait()).exit_code == 0
    await asyncio.sleep(0)  # nothing to wait for: no spare may be on its way
    assert runtime._spare is None and runtime._spare_due is None
    await runtime.close()  # again: nothing left to do


async def test_a_killed_agents_spare_ends_and_the_next_open_removes_its_cgroups(
    tmp_path: Path,
) -> None:
    """An agent killed with a spare closes its pipes by dying (as here by hand): the spare ends
    by itself (ABANDONED), its empty cgroups left behind. The next runtime's open removes the
    empty spare cgroups of agents that are gone, and never one a kernel still runs in, nor one
    a live agent on the same host is making its spare in."""
    dead = ProcessRuntime(spare=True)
    require_cpu_cgroups(dead)
    await dead.open()
    spare = await spare_of(dead)
    dead._spare = None  # the agent is gone: nothing will close its spare, and its pipes closed
    spare._close_go()
    os.close(spare._exit_path or -1)
    spare._exit_path = None
    spare._status.close()
    assert await spare.wrapper.wait() == exitwrap.ABANDONED
    own = [cgroup.path for cgroup in spare.cgroups]  # this (live) process's: as another agent's
    parent = dead._cgroups.parent("cpu")
    assert parent is not None
    gone = await asyncio.create_subprocess_exec("true")
    await gone.wait()  # a pid no agent has any more
    left = parent.path / f"{SPARE_PREFIX}{gone.pid}-left"
    in_use = parent.path / f"{SPARE_PREFIX}{gone.pid}-in-use"  # a kernel that took it runs on
    for path in (left, in_use):
        path.mkdir()
    sleeper = await asyncio.create_subprocess_exec("sleep", "600")
    try:
        (in_use / "cgroup.procs").write_text(f"{sleeper.pid}\n")
        runtime = ProcessRuntime(spare=True)
        await runtime.open()
        assert not left.exists()
        assert in_use.exists()
        assert all(path.exists() for path in own)
        await runtime.close()
    finally:
        sleeper.kill()
        await sleeper.wait()
        for path in (in_use, *own):
            await eventually(lambda path=path: _removed(path), "the emptied cgroup to be removed")


def _removed(cgroup: Path) -> bool:
    """Whether `cgroup` is gone: removed now, or already (another test's runtime, opened on
    this host meanwhile, removes a dead agent's empty spare cgroups too)."""
    try:
        cgroup.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


async def test_a_kernel_from_the_spare_left_running_is_adopted_with_its_real_exit(
    spared: ProcessRuntime, tmp_path: Path
) -> None:
    """Left running by its agent (the `leave` policy), a kernel that took the spare ends
    unwatched; its wrapper still writes the exit status where the kernel's record says, so a
    restarted agent reports the real exit code."""
    launch = make_launch(tmp_path, ("touch ready; read line < go; exit 5",), image="shell")
    launch.work_dir.mkdir(parents=True)
    os.mkfifo(launch.work_dir / "go")
    kernel = await staged_and_started(spared, launch)
    await eventually((launch.work_dir / "ready").exists, "the kernel runs")
    kernel.detach()
    await spared.close()
    with open(launch.work_dir / "go", "w") as fifo:  # noqa: ASYNC230 - a fifo the kernel reads
        fifo.write("end\n")
    await eventually((launch.work_dir / EXIT_FILE).exists, "the wrapper recorded the exit")
    restarted = ProcessRuntime(adopted_poll_s=0.02)
    (left,) = await restarted.find_left(tmp_path)
    adopted = await restarted.adopt(left, launch)
    exit = await adopted.wait()
    assert (exit.exit_code, exit.failure_cause) == (5, None)


async def test_a_start_failure_of_a_kernel_from_the_spare_is_reported_as_ever(
    spared: ProcessRuntime, tmp_path: Path
) -> None:
    """A command missing from the kernel's PATH fails its start with the usual final failure,
    whether or not a spare was about."""
    launch = make_launch(tmp_path, ("corral-no-such-program",))
    await spared.preload(launch)
    await spared.stage(launch)
    with pytest.raises(StageFailure) as failure:
        await spared.start(launch)
    assert failure.value.cause == "kernel_start_failure"
    assert not failure.value.retryable
