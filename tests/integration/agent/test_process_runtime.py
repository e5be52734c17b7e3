"""ProcessRuntime against real child processes: environment, exits, termination, outputs, limits."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path

import pytest

from corral.agent.runtime import KernelLaunch, OutputFile, StageFailure, _process_kernel
from corral.agent.runtime import process as process_runtime
from corral.agent.runtime._cgroups import Cgroup, CgroupProbe
from corral.agent.runtime._kernel_record import (
    RECORD_FILE,
    KernelRecord,
    ProcessIdentity,
    running_since,
)
from corral.agent.runtime.process import ProcessKernel, ProcessRuntime
from corral.domain.failure_causes import FailureCause
from corral.domain.types import new_kernel_id, new_session_id
from tests.conftest import IN_CI
from tests.integration.agent._support import eventually, process_gone

MIB = 1 << 20
WRITE_OUTPUT = (
    "import os, pathlib; "
    "pathlib.Path(os.environ['CORRAL_OUTPUT_DIR'], 'result.txt').write_text('kept')"
)


def make_launch(
    tmp_path: Path,
    command: tuple[str, ...],
    *,
    image: str = "python",
    env: Mapping[str, str] | None = None,
    slots: Mapping[str, int] | None = None,
    devices: tuple[int, ...] = (),
) -> KernelLaunch:
    """A rank-1 kernel of a two-kernel session, working in its own directory under tmp_path."""
    kernel_id = new_kernel_id()
    return KernelLaunch(
        kernel_id=kernel_id,
        session_id=new_session_id(),
        session_type="batch",
        image=image,
        command=command,
        env=env or {},
        cluster_size=2,
        cluster_rank=1,
        cluster_role="worker",
        cluster_hosts=("10.0.0.5", "10.0.0.6"),
        slots=slots or {"cpu": 1000, "mem": 512 * MIB * 1000},  # limited, as real kernels are
        work_dir=tmp_path / str(kernel_id),
        devices=devices,
    )


@pytest.fixture
def runtime() -> ProcessRuntime:
    """A runtime with this host's memory limiting and only the built-in images."""
    return ProcessRuntime()


@pytest.fixture
async def kernels() -> AsyncIterator[list[ProcessKernel]]:
    """Kernels a test started; whatever still runs is killed at teardown."""
    started: list[ProcessKernel] = []
    yield started
    for kernel in started:
        await kernel.terminate(0)


Run = Callable[[ProcessRuntime, KernelLaunch], Awaitable[ProcessKernel]]


@pytest.fixture
def run(kernels: list[ProcessKernel]) -> Run:
    """Preload and start a launch on a runtime, tracking the kernel for teardown."""

    async def start(runtime: ProcessRuntime, launch: KernelLaunch) -> ProcessKernel:
        await runtime.preload(launch)
        kernel = await runtime.start(launch)
        kernels.append(kernel)
        return kernel

    return start


async def stdout_of(kernel: ProcessKernel) -> str:
    """The kernel's whole stdout, once it ended."""
    await kernel.wait()
    return (await kernel.read_log("stdout", 0, 1 << 20)).decode()


async def test_cluster_environment_reaches_the_kernel(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """Rank, size, rendezvous address/port and the assigned devices are in the environment."""
    names = ["CORRAL_CLUSTER_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
    names.append("CUDA_VISIBLE_DEVICES")
    script = f"import json, os; print(json.dumps({{n: os.environ[n] for n in {names!r}}}))"
    launch = make_launch(tmp_path, ("python", "-c", script), devices=(2, 3))
    kernel = await run(runtime, launch)
    assert json.loads(await stdout_of(kernel)) == {
        "CORRAL_CLUSTER_RANK": "1",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": str(launch.master_port),
        "CUDA_VISIBLE_DEVICES": "2,3",
    }


async def test_agent_secrets_stay_out_while_user_env_gets_in(
    runtime: ProcessRuntime, run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's own environment does not leak into a kernel; the user's variables do."""
    monkeypatch.setenv("CORRAL_TEST_AGENT_SECRET", "hunter2")
    script = "import os; print(os.environ.get('CORRAL_TEST_AGENT_SECRET'), os.environ['MINE'])"
    launch = make_launch(tmp_path, ("python", "-c", script), env={"MINE": "ok"})
    assert await stdout_of(await run(runtime, launch)) == "None ok\n"


# Names the exit-status wrapper's shell would use for its own variables, were they not
# reserved ones: a user's variable of such a name reaches the kernel as the user gave it.
WRAPPER_LIKE = ("old", "had_old", "exit_file", "setsid", "status", "o", "h", "me", "start", "go")


async def test_user_variables_named_like_the_wrappers_own_reach_the_kernel_intact(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """The wrapper's shell keeps its own values in variables no user may set (CORRAL_*), so
    none of the user's is overwritten (a shell exports what it imported from the environment,
    with whatever value it was given since)."""
    env = {name: f"user's {name}" for name in WRAPPER_LIKE}
    script = "import os, sys; print(*(os.environ.get(n) for n in sys.argv[1:]), sep='|')"
    launch = make_launch(tmp_path, ("python", "-c", script, *WRAPPER_LIKE), env=env)
    assert await stdout_of(await run(runtime, launch)) == "|".join(env.values()) + "\n"


async def test_the_kernel_keeps_the_agents_core_dump_limit(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """A kernel may dump core as the agent's limits allow: the wrapper forbids its own core
    dump only when it ends by the kernel's signal, after the kernel ended."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    if hard != resource.RLIM_INFINITY and hard < 1 << 20:
        pytest.skip("the hard core-size limit is too low to raise the soft one")
    resource.setrlimit(resource.RLIMIT_CORE, (1 << 20, hard))
    try:
        script = "import resource; print(resource.getrlimit(resource.RLIMIT_CORE)[0])"
        launch = make_launch(tmp_path, ("python", "-c", script))
        assert await stdout_of(await run(runtime, launch)) == f"{1 << 20}\n"
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))


async def test_exit_code_is_reported(runtime: ProcessRuntime, run: Run, tmp_path: Path) -> None:
    """A kernel exiting with 3 is reported as exit code 3 with no runtime failure cause."""
    kernel = await run(runtime, make_launch(tmp_path, ("python", "-c", "raise SystemExit(3)")))
    exit = await kernel.wait()
    assert (exit.exit_code, exit.failure_cause) == (3, None)


async def test_a_restart_continues_the_logs_and_is_recorded(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """Started again as restart 1 (the restart policy): the logs are appended to, so offsets
    already shipped stay valid; the record and the runtime info say which restart runs, and the
    earlier run's exit status is not taken for the new one's."""
    launch = make_launch(tmp_path, ("python", "-c", "print('run'); raise SystemExit(3)"))
    first = await run(runtime, launch)
    assert (await first.wait()).exit_code == 3
    again = await run(runtime, dataclasses.replace(launch, restart=1))
    assert await stdout_of(again) == "run\nrun\n"
    assert again.info["restart"] == 1 and "restart" not in first.info
    record = KernelRecord.read(launch.work_dir / RECORD_FILE)
    assert record.restart == 1
    assert (await again.wait()).exit_code == 3


async def test_kernels_are_watched_without_a_thread_each(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """Eight running kernels have no waiting thread each (asyncio's default watcher on Python
    3.11 starts a `waitpid-<pid>` thread per child): their ends still come, each its own."""
    scripts = [f"trap 'exit {code}' TERM; sleep 600 & wait" for code in range(8)]
    started = [await run(runtime, make_launch(tmp_path, (s,), image="shell")) for s in scripts]
    assert [t.name for t in threading.enumerate() if t.name.startswith("waitpid-")] == []
    ended = [await kernel.terminate(grace_s=5) for kernel in started]
    assert [exit.exit_code for exit in ended] == list(range(8))


async def test_death_by_signal_is_a_negative_code(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """A kernel ended by a signal reports minus that signal's number."""
    script = "import os, signal; os.kill(os.getpid(), signal.SIGUSR1)"
    kernel = await run(runtime, make_launch(tmp_path, ("python", "-c", script)))
    assert (await kernel.wait()).exit_code == -signal.SIGUSR1


async def test_unknown_image_is_a_retryable_image_pull_failure(
    runtime: ProcessRuntime, tmp_path: Path
) -> None:
    """Preloading an image the agent does not know names it and the known ones."""
    with pytest.raises(StageFailure) as failure:
        await runtime.preload(make_launch(tmp_path, ("true",), image="pytorch:99"))
    assert failure.value.cause == "image_pull_failure"
    assert failure.value.retryable
    assert "'pytorch:99'" in failure.value.message
    assert "python, shell" in failure.value.message


async def test_preload_makes_the_work_and_output_directories_even_where_their_parent_is_gone(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """The kernels directory removed under the agent is made again, and the kernel sees its
    output directory; a work directory that cannot be made is a work-dir failure."""
    launch = make_launch(tmp_path / "gone" / "kernels", ("python", "-c", WRITE_OUTPUT))
    kernel = await run(runtime, launch)
    assert (await kernel.wait()).exit_code == 0
    assert (launch.output_dir / "result.txt").read_text() == "kept"
    (tmp_path / "a-file").write_text("")
    with pytest.raises(StageFailure) as failure:
        await runtime.preload(make_launch(tmp_path / "a-file", ("true",)))
    assert failure.value.cause == FailureCause.WORK_DIR_FAILURE
    assert "a-file" in failure.value.message


async def test_missing_interpreter_is_an_image_pull_failure(tmp_path: Path) -> None:
    """A configured image whose interpreter does not exist fails its preload."""
    runtime = ProcessRuntime({"gone": tmp_path / "no-such-python"})
    with pytest.raises(StageFailure) as failure:
        await runtime.preload(make_launch(tmp_path, ("python", "-V"), image="gone"))
    assert failure.value.cause == "image_pull_failure"
    assert "no-such-python" in failure.value.message


async def test_missing_executable_is_a_final_start_failure(
    runtime: ProcessRuntime, tmp_path: Path
) -> None:
    """A command whose program does not exist fails the start, and retrying cannot help."""
    launch = make_launch(tmp_path, ("corral-no-such-program", "--flag"))
    await runtime.preload(launch)
    with pytest.raises(StageFailure) as failure:
        await runtime.start(launch)
    assert failure.value.cause == "kernel_start_failure"
    assert not failure.value.retryable
    assert "corral-no-such-program" in failure.value.message


async def test_a_cgroup_the_kernel_cannot_enter_fails_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kernel whose first process cannot join its cgroup never runs its command: the start
    fails naming the cgroup. (A plain directory stands in for the cgroup v2 tree, its kernel's
    `cgroup.procs` a directory that cannot be written.)"""
    parent = Cgroup(2, tmp_path / "cgroups", frozenset({"cpu"}))
    parent.path.mkdir()
    probe = CgroupProbe((parent,), {"memory": "pretend"})
    monkeypatch.setattr(process_runtime, "probe_cgroups", lambda controllers: probe)
    runtime = ProcessRuntime()
    launch = make_launch(tmp_path, ("touch ran",), image="shell", slots={"cpu": 1000})
    procs = parent.path / f"corral-{launch.kernel_id}" / "cgroup.procs"
    procs.mkdir(parents=True)
    await runtime.preload(launch)
    with pytest.raises(StageFailure) as failure:
        await runtime.start(launch)
    assert failure.value.cause == "kernel_start_failure"
    assert failure.value.message == (
        f"cannot start the kernel: cannot move the kernel into its cgroup ({procs})"
    )
    assert not (launch.start_dir / "ran").exists()


async def test_a_staged_kernel_runs_its_command_only_once_started(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """Staged, the kernel's processes wait (in its cgroups where the host allows them) and its
    command has not run; started, it runs and is reported as any kernel."""
    launch = make_launch(tmp_path, ("echo ran > ran; cat /proc/self/cgroup",), image="shell")
    await runtime.preload(launch)
    await runtime.stage(launch)
    spawned = runtime._staged[launch.kernel_id]
    assert not process_gone(spawned.wrapper.pid)
    assert not (launch.start_dir / "ran").exists()
    kernel = await run(runtime, launch)  # preload again (idempotent), then start: no new spawn
    assert kernel.info["pid"] != spawned.wrapper.pid
    assert (await kernel.wait()).exit_code == 0
    assert (launch.start_dir / "ran").read_text() == "ran\n"
    in_cgroups = (await stdout_of(kernel)).count(f"/corral-{launch.kernel_id}\n")
    assert in_cgroups == len(set(kernel.info.get("cgroups", {}).values()))  # a line per cgroup


async def test_an_unstaged_kernel_never_runs_and_leaves_nothing(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """Given up after staging, the kernel's processes end without running its command and its
    cgroups are removed, while another kernel started meanwhile runs on: the go pipe's write
    end is the agent's alone (no kernel inherits it, or the first would wait for the second)."""
    launch = make_launch(tmp_path, ("touch ran",), image="shell", slots={"cpu": 1000})
    await runtime.preload(launch)
    await runtime.stage(launch)
    spawned = runtime._staged[launch.kernel_id]
    cgroups = [cgroup.path for cgroup in spawned.cgroups]
    other = await run(runtime, make_launch(tmp_path, ("exec sleep 600",), image="shell"))
    await runtime.unstage(launch)
    assert process_gone(spawned.wrapper.pid)
    assert not (launch.start_dir / "ran").exists()
    assert not any(path.exists() for path in cgroups)
    assert not process_gone(other.info["pid"])
    await runtime.unstage(launch)  # again: nothing left to do


async def test_kernels_prepared_together_are_not_staged(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """Staging is for the one kernel an idle agent prepares: two preloaded and not yet started
    (a burst, a gang) are started the ordinary way; once one of them started, and the other was
    given up, a kernel prepared alone is staged again."""
    first, second = (make_launch(tmp_path, ("true",), image="shell") for _ in range(2))
    for launch in (first, second):
        await runtime.preload(launch)
    for launch in (first, second):
        await runtime.stage(launch)
    assert runtime._staged == {}
    kernel = await run(runtime, first)
    assert (await kernel.wait()).exit_code == 0
    await runtime.unstage(second)
    alone = make_launch(tmp_path, ("true",), image="shell")
    await runtime.preload(alone)
    await runtime.stage(alone)
    assert list(runtime._staged) == [alone.kernel_id]


async def test_a_staged_kernel_whose_processes_were_killed_is_started_anew(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """Staged processes killed before the start (an admin, the OOM killer) do not fail it:
    the kernel is spawned again and runs."""
    launch = make_launch(tmp_path, ("echo ran",), image="shell")
    await runtime.preload(launch)
    await runtime.stage(launch)
    wrapper = runtime._staged[launch.kernel_id].wrapper
    children_of = Path(f"/proc/{wrapper.pid}/task/{wrapper.pid}/children")
    children = (await asyncio.to_thread(children_of.read_text)).split()
    os.kill(int(children[0]), signal.SIGKILL)  # the kernel's side, waiting for go
    assert await wrapper.wait() == -signal.SIGKILL
    kernel = await run(runtime, launch)
    assert kernel.info["pid"] != int(children[0])
    assert await stdout_of(kernel) == "ran\n"


async def test_terminate_kills_the_whole_process_tree(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """terminate ends the kernel and every child it started."""
    script = "sleep 600 & echo $! >> pids; sleep 600 & echo $! >> pids; touch ready; wait"
    launch = make_launch(tmp_path, (script,), image="shell")
    kernel = await run(runtime, launch)
    await eventually((launch.work_dir / "ready").exists, "the kernel started its children")
    pids = [int(pid) for pid in (launch.work_dir / "pids").read_text().split()]
    assert (await kernel.terminate(grace_s=5)).exit_code == -signal.SIGTERM
    await eventually(lambda: all(map(process_gone, pids)), f"children {pids} are gone")


async def test_orphans_do_not_outlive_a_kernel(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """A kernel's background children are killed once the kernel itself exits."""
    launch = make_launch(tmp_path, ("sleep 600 & echo $! > pids",), image="shell")
    kernel = await run(runtime, launch)
    assert (await kernel.wait()).exit_code == 0
    orphan = int((launch.work_dir / "pids").read_text())
    await eventually(lambda: process_gone(orphan), f"orphan {orphan} is gone")


async def test_kernel_ignoring_sigterm_is_killed_after_the_grace_period(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """A kernel that traps SIGTERM is SIGKILLed once grace_s has passed."""
    script = (
        "import pathlib, signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "pathlib.Path('ready').touch(); signal.pause()"
    )
    launch = make_launch(tmp_path, ("python", "-c", script))
    kernel = await run(runtime, launch)
    await eventually((launch.work_dir / "ready").exists, "the kernel ignores SIGTERM")
    assert (await kernel.terminate(grace_s=0.1)).exit_code == -signal.SIGKILL


async def test_terminate_twice_and_after_exit_is_harmless(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """terminate is idempotent: again, concurrently or after the end, it reports the same exit."""
    kernel = await run(runtime, make_launch(tmp_path, ()))
    first, second = await asyncio.gather(kernel.terminate(5), kernel.terminate(5))
    assert first == second == await kernel.terminate(5) == await kernel.wait()
    assert first.exit_code == -signal.SIGTERM  # an empty command idles until terminated

    ended = await run(runtime, make_launch(tmp_path, ("python", "-c", "pass")))
    assert (await ended.wait()).exit_code == 0
    assert (await ended.terminate(5)).exit_code == 0


async def test_outputs_are_listed_and_read(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """Files under the output directory are listed by relative name with sizes, and readable."""
    script = (
        "import os, pathlib; out = pathlib.Path(os.environ['CORRAL_OUTPUT_DIR']); "
        "(out / 'sub').mkdir(); (out / 'sub' / 'b.bin').write_bytes(b'12345'); "
        "(out / 'a.txt').write_text('hi'); (out / 'link').symlink_to('/etc/hostname')"
    )
    kernel = await run(runtime, make_launch(tmp_path, ("python", "-c", script)))
    assert (await kernel.wait()).exit_code == 0
    assert await kernel.list_outputs() == [OutputFile("a.txt", 2), OutputFile("sub/b.bin", 5)]
    assert await kernel.read_output("sub/b.bin") == b"12345"
    for escape in ("../stdout.log", "/etc/hostname", "link", "sub/../.."):
        with pytest.raises(ValueError, match="outside the kernel's output directory"):
            await kernel.read_output(escape)


async def test_a_kernel_that_leaves_no_outputs_lists_none(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """No file in the output directory, or no output directory at all: no outputs."""
    launch = make_launch(tmp_path, ("true",), image="shell")
    kernel = await run(runtime, launch)
    assert (await kernel.wait()).exit_code == 0
    assert await kernel.list_outputs() == []
    launch.output_dir.rmdir()
    assert await kernel.list_outputs() == []


async def test_logs_are_read_by_offset_and_limit(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """read_log returns the requested byte range of each stream; past the end is empty."""
    script = "import sys; print('0123456789', end=''); print('oops', file=sys.stderr)"
    kernel = await run(runtime, make_launch(tmp_path, ("python", "-c", script)))
    await kernel.wait()
    assert await kernel.read_log("stdout", 3, 4) == b"3456"
    assert await kernel.read_log("stdout", 10, 100) == b""
    assert await kernel.read_log("stderr", 0, 100) == b"oops\n"
    with pytest.raises(ValueError, match="unknown log stream"):
        await kernel.read_log("stdin", 0, 1)


async def test_python_image_runs_the_configured_interpreter(run: Run, tmp_path: Path) -> None:
    """Under the python image, `python` and `python3` are the agent's `--python` interpreter."""
    runtime = ProcessRuntime(python=sys.executable)
    script = "import sys; print(sys.executable)"
    for alias in ("python", "python3"):
        kernel = await run(runtime, make_launch(tmp_path, (alias, "-c", script)))
        assert await stdout_of(kernel) == f"{sys.executable}\n"


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A fresh venv (no pip) made from the agent's interpreter."""
    path = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path


async def test_venv_image_runs_with_virtual_env_set(run: Run, tmp_path: Path, venv: Path) -> None:
    """A configured venv image runs its own python with VIRTUAL_ENV and its bin first on PATH."""
    runtime = ProcessRuntime({"ml": venv})
    script = "import os, sys; print(os.environ['VIRTUAL_ENV'], sys.prefix, os.environ['PATH'])"
    kernel = await run(runtime, make_launch(tmp_path, ("python", "-c", script), image="ml"))
    virtual_env, prefix, path = (await stdout_of(kernel)).split()
    assert virtual_env == prefix == str(venv)
    assert path.split(os.pathsep)[0] == str(venv / "bin")


async def test_shell_image_runs_a_script_or_joins_an_argv(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """Under the shell image one element is a script, several are quoted and joined."""
    script = make_launch(tmp_path, ("echo rank=$RANK",), image="shell")
    assert await stdout_of(await run(runtime, script)) == "rank=1\n"
    argv = make_launch(tmp_path, ("echo", "a  b", "$RANK"), image="shell")
    assert await stdout_of(await run(runtime, argv)) == "a  b $RANK\n"


async def test_info_reports_host_and_pid(run: Run, tmp_path: Path) -> None:
    """A kernel's info carries the agent's address when given, and the kernel's pid."""
    runtime = ProcessRuntime(host="10.1.2.3")
    kernel = await run(
        runtime, make_launch(tmp_path, ("python", "-c", "import os; print(os.getpid())"))
    )
    assert (kernel.info["host"], str(kernel.info["pid"])) == (
        "10.1.2.3",
        (await stdout_of(kernel)).strip(),
    )


async def test_memory_limit_through_a_cgroup_reports_oom_killed(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """With cgroups, a kernel allocating past its mem slot is OOM-killed and its cgroup removed."""
    if runtime.memory_limit_mode != "cgroup":
        pytest.skip(f"no cgroup memory limits on this host: {runtime.notes().lines[0]}")
    assert runtime.notes().lines[0].startswith("memory limits: cgroup v")
    script = f"data = b'x' * {512 * MIB}; print(len(data))"
    launch = make_launch(tmp_path, ("python", "-c", script), slots={"mem": 64 * MIB * 1000})
    kernel = await run(runtime, launch)
    exit = await kernel.wait()
    assert (exit.exit_code, exit.failure_cause) == (-signal.SIGKILL, "oom_killed")
    assert not await asyncio.to_thread(Path(kernel.info["cgroups"]["memory"]).exists)


def require_cpu_cgroups(runtime: ProcessRuntime) -> None:
    """Skip where this host allows no cpu cgroups; in CI, where the machines do, fail."""
    if runtime.cpu_limit_mode != "cgroup":
        reason = f"no cgroup cpu limits on this host: {runtime.notes().lines[1]}"
        if IN_CI:
            pytest.fail(f"{reason}; the CI machines allow them")
        pytest.skip(reason)


def cpu_quota_of(cgroup: Path) -> str:
    """The cgroup's CFS limit as "<quota_us> <period_us>", from v2's cpu.max or v1's files."""
    if (cgroup / "cpu.max").exists():
        return (cgroup / "cpu.max").read_text().strip()
    quota, period = (
        (cgroup / name).read_text().strip() for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us")
    )
    return f"{quota} {period}"


async def test_cpu_limit_through_a_cgroup_matches_the_cpu_slot(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """With cgroups, a kernel runs in a cgroup whose CFS quota is its cpu slot, removed after."""
    require_cpu_cgroups(runtime)
    assert runtime.notes().lines[1].startswith("cpu limits: cgroup v")
    script = "touch ready; exec sleep 600"
    launch = make_launch(tmp_path, (script,), image="shell", slots={"cpu": 1500})
    kernel = await run(runtime, launch)
    await eventually((launch.work_dir / "ready").exists, "the kernel runs")
    cgroup = Path(kernel.info["cgroups"]["cpu"])
    assert cgroup.name == f"corral-{launch.kernel_id}"
    assert str(kernel.info["pid"]) in (cgroup / "cgroup.procs").read_text().split()
    assert cpu_quota_of(cgroup) == "150000 100000"
    assert "memory" not in kernel.info["cgroups"]  # no mem slot, no memory limit
    await kernel.terminate(grace_s=5)
    assert not await asyncio.to_thread(cgroup.exists)


async def test_kernel_without_a_cpu_slot_gets_no_cpu_cgroup(
    runtime: ProcessRuntime, run: Run, tmp_path: Path
) -> None:
    """A kernel without a cpu slot runs with no cpu limit, whatever the host allows."""
    launch = make_launch(tmp_path, ("python", "-c", "pass"), slots={"mem": 512 * MIB * 1000})
    kernel = await run(runtime, launch)
    assert (await kernel.wait()).exit_code == 0
    assert "cpu" not in kernel.info.get("cgroups", {})


async def test_cpu_cgroup_with_best_effort_memory_limit(
    run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where only cpu cgroups can be made, a kernel gets its cpu cgroup and RLIMIT_AS both."""
    cpu_only = process_runtime.probe_cgroups(("cpu",))
    without_memory = CgroupProbe(cpu_only.parents, {**cpu_only.reasons, "memory": "pretend"})
    monkeypatch.setattr(process_runtime, "probe_cgroups", lambda controllers: without_memory)
    runtime = ProcessRuntime()
    require_cpu_cgroups(runtime)
    assert runtime.memory_limit_mode == "rlimit"
    script = (
        "import pathlib, resource; print(resource.getrlimit(resource.RLIMIT_AS)[0]); "
        "print(pathlib.Path('/proc/self/cgroup').read_text())"
    )
    slots = {"cpu": 500, "mem": 256 * MIB * 1000}
    launch = make_launch(tmp_path, ("python", "-c", script), slots=slots)
    kernel = await run(runtime, launch)
    limit, cgroups = (await stdout_of(kernel)).split("\n", 1)
    assert int(limit) == 256 * MIB
    assert f"/corral-{launch.kernel_id}\n" in cgroups
    assert list(kernel.info["cgroups"]) == ["cpu"]


async def test_memory_limit_best_effort_without_cgroups(
    run: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without usable cgroups RLIMIT_AS ends an over-allocating kernel, but not a GPU kernel's."""
    without = CgroupProbe(reasons={"memory": "pretend", "cpu": "pretend"})
    monkeypatch.setattr(process_runtime, "probe_cgroups", lambda controllers: without)
    runtime = ProcessRuntime()
    assert runtime.memory_limit_mode == "rlimit"
    assert runtime.notes().lines[0].startswith("memory limits: best effort (RLIMIT_AS")
    # An untouched gigabyte mapping: refused by the address-space limit, cheap when allowed.
    command = ("python", "-c", f"import mmap; data = mmap.mmap(-1, {1024 * MIB})")
    slots = {"mem": 256 * MIB * 1000}
    limited = await run(runtime, make_launch(tmp_path, command, slots=slots))
    assert (await limited.wait()).exit_code == 1
    assert b"Cannot allocate memory" in await limited.read_log("stderr", 0, 1 << 16)
    gpu = await run(runtime, make_launch(tmp_path, command, slots=slots, devices=(0,)))
    assert (await gpu.wait()).exit_code == 0


def test_memory_limits_can_be_switched_off() -> None:
    """memory_limits=False enforces nothing and says so in the startup notes."""
    runtime = ProcessRuntime(memory_limits=False)
    assert runtime.memory_limit_mode == "off"
    assert runtime.notes().lines[0] == "memory limits: off (disabled in the agent's configuration)"


def test_configured_images_cannot_shadow_builtins() -> None:
    """Configuring an image named like a built-in one is refused at construction."""
    with pytest.raises(ValueError, match="built in"):
        ProcessRuntime({"python": "/usr/bin/python3"})


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give files to another user")
def test_outputs_of_a_kernel_run_as_another_user_are_its_own_files_only(tmp_path: Path) -> None:
    """An outputs directory that is another user's (a kernel run as its owner): the agent lists
    and reads only regular files of that user, so a root-owned file in it (as a hard link
    would be) or a link out of it is never shipped as an output."""
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    (outputs / "result.txt").write_text("mine")
    os.chown(outputs / "result.txt", 65534, 65534)
    (outputs / "roots.txt").write_text("root's secret")
    (outputs / "link").symlink_to("/etc/hostname")
    os.chown(outputs, 65534, 65534)

    assert [f.name for f in _process_kernel._list_files(outputs)] == ["result.txt"]
    assert _process_kernel._read_inside(outputs, "result.txt") == b"mine"
    for name in ("roots.txt", "link"):
        with pytest.raises(ValueError):
            _process_kernel._read_inside(outputs, name)


async def test_a_kernel_that_leads_no_group_yet_is_signalled_alone() -> None:
    """Between its `started` line and `setsid` the kernel is in its wrapper's group: a signal
    for its group (none has its id yet) reaches the kernel itself, and only while the recorded
    process is still the one that runs under that pid."""
    child = await asyncio.create_subprocess_exec("sleep", "600")  # in this process's group
    identity = ProcessIdentity(child.pid, running_since(child.pid))
    stranger = ProcessIdentity(child.pid, (identity.start_ticks or 0) + 1)
    _process_kernel.signal_kernel(stranger, signal.SIGKILL)  # not the recorded process: spared
    assert not process_gone(child.pid)
    _process_kernel.signal_kernel(identity, signal.SIGKILL)
    assert await child.wait() == -signal.SIGKILL
    _process_kernel.signal_kernel(identity, signal.SIGKILL)  # gone: nothing to do, no error
