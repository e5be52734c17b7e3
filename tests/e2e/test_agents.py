"""End to end: a real manager and `corral agent` processes running real kernels over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from corral.domain.status import KernelStatus, SessionStatus
from corral.domain.types import KernelId
from corral.store.log_reading import read_log
from tests.e2e._cluster import live_cluster, poll

S, K = SessionStatus, KernelStatus

# Prints what a rank sees of its cluster as one JSON line, then meets the other rank at
# MASTER_ADDR:MASTER_PORT as a distributed job's ranks would: rank 0 listens, rank 1 connects
# and waits for rank 0's process to end (its end closes the connection). Rank 0 so always ends
# first, by itself: a session ends when any kernel ends (spec 1's DetectTermination), and a
# rank 1 ending first would have rank 0 stopped — before it printed, or with a signal's code.
_WHO_AM_I = """
import json, os, socket, sys, time
keys = ('CORRAL_CLUSTER_RANK', 'CORRAL_CLUSTER_SIZE', 'CORRAL_CLUSTER_HOSTS',
        'MASTER_ADDR', 'MASTER_PORT', 'WORLD_SIZE', 'RANK')
print(json.dumps({k: os.environ[k] for k in keys}), flush=True)
master = (os.environ['MASTER_ADDR'], int(os.environ['MASTER_PORT']))
if os.environ['RANK'] == '0':
    server = socket.create_server(master)
    peer, _ = server.accept()
    os._exit(0)
deadline = time.monotonic() + 60
while True:
    try:
        peer = socket.create_connection(master)
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit('rank 0 never listened')
        time.sleep(0.05)
while peer.recv(1):
    pass
"""


async def test_multi_node_ranks_see_one_consistent_cluster(
    database_url: str, tmp_path: Path
) -> None:
    """Two kernels on two agents see the same size, hosts and master, and their own ranks."""
    async with live_cluster(database_url, tmp_path) as cluster:
        cluster.start_agent("node-a", "cpu=1,mem=1g", address="127.0.0.1")
        cluster.start_agent("node-b", "cpu=1,mem=1g", address="127.0.0.2")
        await cluster.wait_agents_alive({"node-a", "node-b"})
        sid = await cluster.submit(
            image="python",
            command=["python", "-c", _WHO_AM_I],
            resources={"cpu": 1, "mem": "512m"},
            cluster_mode="multi-node",
            cluster_size=2,
        )
        row = await cluster.wait_status(sid)
        assert row["status"] == S.TERMINATED, row
        assert row["result"] == "success"
        kernels = await cluster.kernels(sid)
        assert {k["agent_id"] for k in kernels} == {"node-a", "node-b"}
        seen = [
            json.loads(await read_log(cluster.db, KernelId(k["id"]), "stdout")) for k in kernels
        ]
        hosts_by_rank = {"127.0.0.1" if k["agent_id"] == "node-a" else "127.0.0.2" for k in kernels}
        assert [s["CORRAL_CLUSTER_RANK"] for s in seen] == ["0", "1"]
        assert [s["RANK"] for s in seen] == ["0", "1"]
        assert {s["CORRAL_CLUSTER_SIZE"] for s in seen} == {"2"}
        assert {s["WORLD_SIZE"] for s in seen} == {"2"}
        assert len({s["CORRAL_CLUSTER_HOSTS"] for s in seen}) == 1
        hosts = seen[0]["CORRAL_CLUSTER_HOSTS"].split(",")
        assert set(hosts) == hosts_by_rank
        assert {s["MASTER_ADDR"] for s in seen} == {hosts[0]}
        assert len({s["MASTER_PORT"] for s in seen}) == 1


async def test_nonzero_exit_ends_in_error_with_its_code_and_logs(
    database_url: str, tmp_path: Path
) -> None:
    """A batch command exiting 3: ERROR, cause kernel_nonzero_exit, exit code 3, logs kept."""
    async with live_cluster(database_url, tmp_path) as cluster:
        cluster.start_agent("node-a", "cpu=2,mem=2g")
        await cluster.wait_agents_alive({"node-a"})
        sid = await cluster.submit(
            image="shell",
            command=["echo to-stdout; echo to-stderr >&2; exit 3"],
            resources={"cpu": 1, "mem": "256m"},
        )
        row = await cluster.wait_status(sid)
        assert (row["status"], row["failure_cause"], row["exit_code"]) == (
            S.ERROR,
            "kernel_nonzero_exit",
            3,
        )
        (kernel,) = await cluster.kernels(sid)
        assert await read_log(cluster.db, KernelId(kernel["id"]), "stdout") == b"to-stdout\n"
        assert await read_log(cluster.db, KernelId(kernel["id"]), "stderr") == b"to-stderr\n"


async def test_unknown_image_fails_after_bounded_preload_retries(
    database_url: str, tmp_path: Path
) -> None:
    """An unknown image is retried three times on the agent, then the session ends in ERROR."""
    async with live_cluster(database_url, tmp_path) as cluster:
        cluster.start_agent("node-a", "cpu=2,mem=2g")
        await cluster.wait_agents_alive({"node-a"})
        sid = await cluster.submit(
            image="no-such-image", command=["true"], resources={"cpu": 1, "mem": "256m"}
        )
        row = await cluster.wait_status(sid)
        assert (row["status"], row["failure_cause"]) == (S.ERROR, "image_pull_failure")
        log = cluster.agent_log("node-a")
        assert log.count("kernel.stage_failed") == 3, log
        assert log.count("stage=PRELOADING cause=image_pull_failure") == 3


async def test_killed_agent_fails_its_sessions_and_spares_the_others(
    database_url: str, tmp_path: Path
) -> None:
    """SIGKILL an agent mid-run: its session ends in ERROR (agent_lost); the other runs on."""
    async with live_cluster(database_url, tmp_path, heartbeat_timeout_s=8) as cluster:
        cluster.start_agent("node-a", "cpu=1,mem=1g")
        cluster.start_agent("node-b", "cpu=1,mem=1g")
        await cluster.wait_agents_alive({"node-a", "node-b"})
        spec = {"image": "shell", "command": ["sleep 600"], "resources": {"cpu": 1, "mem": "256m"}}
        first, second = await cluster.submit(**spec), await cluster.submit(**spec)
        for sid in (first, second):
            await cluster.wait_status(sid, {S.RUNNING})
        holder = {sid: (await cluster.kernels(sid))[0]["agent_id"] for sid in (first, second)}
        assert set(holder.values()) == {"node-a", "node-b"}
        victim = cluster.agents["node-a"]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        lost = first if holder[first] == "node-a" else second
        spared = second if lost == first else first
        (orphan,) = await cluster.kernels(lost)
        try:
            row = await cluster.wait_status(lost)
            assert (row["status"], row["failure_cause"]) == (S.ERROR, "agent_lost")
            assert (await cluster.session(spared))["status"] == S.RUNNING
        finally:
            await _reap(orphan["runtime_info"])


async def _reap(info: dict[str, object]) -> None:
    """End a kernel its killed agent left behind (its process group) and remove its cgroups."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(int(str(info["pid"])), signal.SIGKILL)
    cgroups = info.get("cgroups") or {}
    assert isinstance(cgroups, dict)
    for path in map(Path, cgroups.values()):

        async def removed(path: Path = path) -> bool:
            try:
                os.rmdir(path)  # EBUSY until the killed processes have left it (cgroupfs: no disk)
            except FileNotFoundError:
                return True
            except OSError:
                return False
            return True

        await poll(removed, what=f"cgroup {path} to be removed")


async def test_terminating_a_running_session_kills_its_process_tree(
    database_url: str, tmp_path: Path
) -> None:
    """Terminate: the kernel and every process it started are gone; the session TERMINATED."""
    async with live_cluster(database_url, tmp_path) as cluster:
        cluster.start_agent("node-a", "cpu=2,mem=2g")
        await cluster.wait_agents_alive({"node-a"})
        sid = await cluster.submit(
            image="shell",
            command=[
                "sleep 600 & echo $! > pids; sleep 600 & echo $! >> pids; echo $$ >> pids; wait"
            ],
            resources={"cpu": 1, "mem": "256m"},
        )
        await cluster.wait_status(sid, {S.RUNNING})
        (kernel,) = await cluster.kernels(sid)
        pid_file = cluster.agent_dir("node-a") / "kernels" / str(kernel["id"]) / "pids"

        async def pids_written() -> bool:
            return pid_file.exists() and len(pid_file.read_text().split()) == 3

        await poll(pids_written, what="the kernel to write its pids")
        pids = [int(p) for p in pid_file.read_text().split()]
        assert cluster.manager.parts is not None
        await cluster.manager.parts.sessions.mark_terminate([sid], "test: terminate")
        row = await cluster.wait_status(sid)
        assert row["status"] == S.TERMINATED

        async def all_gone() -> bool:
            return not any(_alive(pid) for pid in pids)

        await poll(all_gone, what=f"processes {pids} to end")


def _alive(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


pytestmark = pytest.mark.timeout(120)


async def test_agents_reconnect_to_a_restarted_manager(database_url: str, tmp_path: Path) -> None:
    """The manager restarts: the agent reconnects, its running kernel is kept and still obeys."""
    async with live_cluster(database_url, tmp_path, heartbeat_timeout_s=30) as cluster:
        cluster.start_agent("node-a", "cpu=2,mem=2g")
        await cluster.wait_agents_alive({"node-a"})
        spec = {"image": "shell", "command": ["sleep 600"], "resources": {"cpu": 1, "mem": "256m"}}
        running = await cluster.submit(**spec)
        await cluster.wait_status(running, {S.RUNNING})
        await cluster.restart_manager()
        after = await cluster.submit(
            image="shell", command=["echo after"], resources=spec["resources"]
        )
        assert (await cluster.wait_status(after))["status"] == S.TERMINATED
        assert (await cluster.session(running))["status"] == S.RUNNING
        assert cluster.manager.parts is not None
        await cluster.manager.parts.sessions.mark_terminate([running], "test")
        assert (await cluster.wait_status(running))["status"] == S.TERMINATED
        assert "agent.manager_unreachable" in cluster.agent_log("node-a")


async def test_an_agent_restarted_after_leaving_adopts_its_running_kernel(
    tmp_path: Path, sqlite_template: Path
) -> None:
    """`--on-shutdown leave`, SIGTERM, the same agent again: the kernel runs on and obeys it.

    SQLite only: adoption is the agent's affair; the manager's backend plays no part in it.
    """
    database = tmp_path / "corral.db"
    shutil.copyfile(sqlite_template, database)
    async with live_cluster(f"sqlite:///{database}", tmp_path, heartbeat_timeout_s=30) as cluster:
        cluster.start_agent("node-a", "cpu=2,mem=2g", "--on-shutdown", "leave")
        await cluster.wait_agents_alive({"node-a"})
        spec = {"image": "shell", "command": ["exec sleep 600"], "resources": {"cpu": 1}}
        sid = await cluster.submit(**spec)
        await cluster.wait_status(sid, {S.RUNNING})
        (kernel,) = await cluster.kernels(sid)
        pid = int(kernel["runtime_info"]["pid"])
        try:
            first = cluster.agents["node-a"]
            first.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(first.wait, 30) == 0
            assert _alive(pid), "the leave policy ended the kernel"

            cluster.start_agent("node-a", "cpu=2,mem=2g")

            async def adopted() -> bool:
                return "agent.kernel_adopted" in cluster.agent_log("node-a")

            await poll(adopted, what="the restarted agent to adopt the kernel")
            (kernel,) = await cluster.kernels(sid)
            assert (kernel["status"], kernel["failure_cause"]) == (K.RUNNING, None)
            assert cluster.manager.parts is not None
            await cluster.manager.parts.sessions.mark_terminate([sid], "test: terminate")
            assert (await cluster.wait_status(sid))["status"] == S.TERMINATED

            async def gone() -> bool:
                return not _alive(pid)

            await poll(gone, what=f"the adopted kernel {pid} to end")
        finally:
            await _reap(kernel["runtime_info"])
