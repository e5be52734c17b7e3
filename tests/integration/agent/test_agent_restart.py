"""An agent daemon stopped under the `leave` policy and started again adopts its kernels.

The manager is the real daemon in this process (HTTP on a free port, its coordinator loops and
lost sweep: the e2e tests' `live_cluster`). The agents are AgentDaemon instances in this process
too, with the process runtime and real kernels, one after the other on the same data directory
and id, as `corral agent` restarted. SQLite only: adoption is the agent's affair, and the
manager's backend plays no part in it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from corral.agent.client import HttpManagerClient
from corral.agent.daemon import KERNELS_DIR, AgentConfig, AgentDaemon
from corral.agent.kernel_worker import WorkerSettings
from corral.agent.runtime._kernel_record import EXIT_FILE, RECORD_FILE, KernelRecord
from corral.agent.runtime.process import ProcessRuntime
from corral.domain.slots import ResourceSlots
from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import KernelId, SessionId
from corral.store.log_reading import read_log
from tests.e2e._cluster import JOIN_TOKEN, LiveCluster, live_cluster
from tests.integration.agent._support import eventually, process_gone
from tests.integration.agent.test_process_adoption import WAITER

S, K = SessionStatus, KernelStatus
AGENT_ID = "node-a"
DEADLINE_S = 30.0  # a whole session's way through the manager's loops
RESOURCES = {"cpu": 1, "mem": "256m"}

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def sqlite_url(tmp_path: Path, sqlite_template: Path) -> str:
    """A fresh, migrated SQLite file."""
    path = tmp_path / "corral.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


@dataclass
class Node:
    """One host: agent daemons started and stopped on the same data directory and id."""

    cluster: LiveCluster
    data_dir: Path
    daemon: AgentDaemon | None = None
    task: asyncio.Task[None] | None = None
    strangers: list[asyncio.subprocess.Process] = field(default_factory=list)

    async def start(self) -> AgentDaemon:
        """Start an agent (policy `leave`) and wait until it registered."""
        config = AgentConfig(
            agent_id=AGENT_ID,
            token=JOIN_TOKEN,
            address="127.0.0.1",
            slots=ResourceSlots.parse("cpu=2,mem=2g"),
            data_dir=self.data_dir,
            on_shutdown="leave",
            worker=WorkerSettings(stop_grace_s=2, log_interval_s=0.05),
            shutdown_flush_s=5,
        )
        runtime = ProcessRuntime(adopted_poll_s=0.05)
        self.daemon = AgentDaemon(config, HttpManagerClient(self.cluster.manager.url), runtime)
        self.task = asyncio.create_task(self.daemon.run())
        registered = asyncio.ensure_future(self.daemon.registered.wait())
        await asyncio.wait({registered, self.task}, return_when=asyncio.FIRST_COMPLETED)
        assert registered.done(), "the agent ended before it registered"
        return self.daemon

    async def stop(self) -> None:
        """SIGTERM, as it were: the agent stops and leaves its kernels running."""
        if self.daemon is not None and self.task is not None:
            await self.daemon.stop()
            await self.task
        self.daemon = self.task = None

    def work_dir(self, kernel_id: KernelId) -> Path:
        return self.data_dir / KERNELS_DIR / str(kernel_id)

    def record(self, kernel_id: KernelId) -> KernelRecord:
        return KernelRecord.read(self.work_dir(kernel_id) / RECORD_FILE)

    async def clean_up(self) -> None:
        """Stop the agent, then kill whatever kernel is still recorded and remove its cgroups."""
        await self.stop()
        runtime = ProcessRuntime()
        records = await runtime.find_left(self.data_dir / KERNELS_DIR)
        for left in records:
            await runtime.discard(left)
        for stranger in self.strangers:
            if stranger.returncode is None:
                stranger.kill()
            await stranger.wait()
        wrappers = [left.wrapper.pid for left in records if isinstance(left, KernelRecord)]
        await eventually(lambda: all(map(process_gone, wrappers)), "left kernels to end")


@asynccontextmanager
async def _node(sqlite_url: str, tmp_path: Path, heartbeat_timeout_s: float) -> AsyncIterator[Node]:
    async with live_cluster(sqlite_url, tmp_path, heartbeat_timeout_s=heartbeat_timeout_s) as c:
        host = Node(c, tmp_path / "agent")
        try:
            yield host
        finally:
            await host.clean_up()


@pytest.fixture
async def node(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Node]:
    """A live manager and a node whose agents it has not seen yet."""
    async with _node(sqlite_url, tmp_path, heartbeat_timeout_s=30) as host:
        yield host


async def run_waiter(node: Node, exit_code: int) -> tuple[SessionId, KernelId, int]:
    """A session of the WAITER kernel, RUNNING under a first agent; its ids and kernel pid."""
    await node.start()
    command = ["python", "-c", WAITER, str(exit_code)]
    sid = await node.cluster.submit(image="python", command=command, resources=RESOURCES)
    await node.cluster.wait_status(sid, {S.RUNNING})
    (kernel,) = await node.cluster.kernels(sid)
    kid = KernelId(kernel["id"])
    await eventually((node.work_dir(kid) / "ready").exists, "the kernel is ready")
    return sid, kid, int(kernel["runtime_info"]["pid"])


async def manager_log(node: Node, kernel_id: KernelId) -> bytes:
    return await read_log(node.cluster.db, kernel_id, "stdout")


async def test_a_restarted_agent_adopts_its_running_kernel(node: Node) -> None:
    """Left running, adopted (no kernel_lost), its logs continued, its exit 3 reported."""
    sid, kid, pid = await run_waiter(node, exit_code=3)
    await eventually(lambda: manager_log(node, kid), "the first agent ships the log")
    assert await manager_log(node, kid) == b"started\n"
    await node.stop()
    assert not process_gone(pid), "the leave policy killed the kernel"
    os.kill(pid, signal.SIGUSR2)  # printed while no agent watches
    stdout = node.work_dir(kid) / "stdout.log"
    await eventually(lambda: stdout.read_bytes() == b"started\nmore\n", "the kernel prints")

    second = await node.start()
    await eventually(lambda: kid in second.workers, "the second agent takes the kernel over")

    async def logs_continued() -> bool:
        return await manager_log(node, kid) == b"started\nmore\n"

    # Not sent again from offset 0: the manager would keep its first chunk there, and drop
    # "more" with the longer one.
    await eventually(logs_continued, "the adopting agent ships what the kernel printed since")
    (kernel,) = await node.cluster.kernels(sid)
    assert (kernel["status"], kernel["failure_cause"]) == (K.RUNNING, None)
    assert (await node.cluster.session(sid))["status"] == S.RUNNING
    os.kill(pid, signal.SIGUSR1)
    row = await node.cluster.wait_status(sid)
    assert (row["status"], row["failure_cause"], row["exit_code"]) == (
        S.ERROR,
        "kernel_nonzero_exit",
        3,
    )


async def test_a_kernel_that_ended_while_its_agent_was_away_reports_its_real_exit(
    node: Node,
) -> None:
    """The kernel exits 0 with no agent running: the next agent reports success, not lost."""
    sid, kid, pid = await run_waiter(node, exit_code=0)
    await node.stop()
    os.kill(pid, signal.SIGUSR1)
    await eventually((node.work_dir(kid) / EXIT_FILE).exists, "the exit status is recorded")
    await node.start()
    row = await node.cluster.wait_status(sid)
    assert (row["status"], row["result"], row["exit_code"]) == (S.TERMINATED, "success", 0)


async def test_a_recorded_pid_now_held_by_a_stranger_is_reported_lost(node: Node) -> None:
    """Kernel and wrapper gone, their pid reused: kernel_lost, and the stranger lives on."""
    sid, kid, pid = await run_waiter(node, exit_code=0)
    await node.stop()
    record = node.record(kid)
    os.kill(record.wrapper.pid, signal.SIGKILL)  # first: it would record the kernel's death
    os.killpg(pid, signal.SIGKILL)
    await eventually(lambda: process_gone(pid), "the kernel to end")
    stranger = await asyncio.create_subprocess_exec("sleep", "600", start_new_session=True)
    node.strangers.append(stranger)
    replace(
        record,
        wrapper=replace(record.wrapper, pid=stranger.pid),
        kernel=replace(record.kernel, pid=stranger.pid),
    ).write()
    await node.start()
    row = await node.cluster.wait_status(sid)
    assert (row["status"], row["failure_cause"]) == (S.ERROR, "kernel_lost")
    assert not process_gone(stranger.pid), "the stranger holding the recorded pid was killed"


async def test_terminating_an_adopted_kernel_kills_its_process_tree(node: Node) -> None:
    """Terminate after adoption: SIGTERM to the adopted group; every process of it is gone."""
    await node.start()
    script = "sleep 600 & echo $! >> pids; sleep 600 & echo $! >> pids; echo $$ >> pids; wait"
    sid = await node.cluster.submit(image="shell", command=[script], resources=RESOURCES)
    await node.cluster.wait_status(sid, {S.RUNNING})
    (kernel,) = await node.cluster.kernels(sid)
    kid = KernelId(kernel["id"])
    pid_file = node.work_dir(kid) / "pids"
    await eventually(
        lambda: pid_file.exists() and len(pid_file.read_text().split()) == 3, "the kernel's pids"
    )
    pids = [int(p) for p in pid_file.read_text().split()]
    await node.stop()
    second = await node.start()
    await eventually(lambda: kid in second.workers, "the second agent takes the kernel over")
    assert not any(map(process_gone, pids))
    assert node.cluster.manager.parts is not None
    await node.cluster.manager.parts.sessions.mark_terminate([sid], "test: terminate")
    row = await node.cluster.wait_status(sid)
    assert row["status"] == S.TERMINATED
    await eventually(lambda: all(map(process_gone, pids)), f"processes {pids} to end")
    for cgroup in (kernel["runtime_info"].get("cgroups") or {}).values():
        await eventually(lambda cgroup=cgroup: not Path(cgroup).exists(), "cgroups removed")


@pytest.fixture
async def forgetful_node(sqlite_url: str, tmp_path: Path) -> AsyncIterator[Node]:
    """A node whose manager declares a silent agent lost after 2 s."""
    async with _node(sqlite_url, tmp_path, heartbeat_timeout_s=2) as host:
        yield host


async def test_a_left_kernel_the_manager_gave_up_on_is_killed(forgetful_node: Node) -> None:
    """Back after the agent was declared lost: its old kernel is not its any more, so it dies."""
    node = forgetful_node
    sid, kid, pid = await run_waiter(node, exit_code=0)
    await node.stop()
    row = await node.cluster.wait_status(sid)
    assert (row["status"], row["failure_cause"]) == (S.ERROR, "agent_lost")
    assert not process_gone(pid)
    wrapper = node.record(kid).wrapper.pid
    await node.start()
    await eventually(lambda: process_gone(pid) and process_gone(wrapper), "the kernel killed")
    record = node.work_dir(kid) / RECORD_FILE
    await eventually(lambda: not record.exists(), "its record removed (after its cgroups)")
