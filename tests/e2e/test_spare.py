"""The process runtime's spare through a real `corral agent`: made when the agent starts (on a
host whose cgroup joins wait for an RCU grace period), taken by a lone job, replaced, and gone
with the agent."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from corral.agent.runtime.process import SPARE_PREFIX
from corral.domain.status import SessionStatus
from corral.domain.types import KernelId
from corral.store.log_reading import read_log
from tests.conftest import IN_CI
from tests.e2e._cluster import LiveCluster, live_cluster, poll

SPARE_NOTE = "a spare kernel process waits in cgroups of its own"


def _spares(agent_pid: int) -> list[int]:
    """The agent's children that are spares' wrappers (`corral-wrapper / -`, not yet claimed)."""
    children = Path(f"/proc/{agent_pid}/task/{agent_pid}/children").read_text().split()
    found = []
    for pid in children:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if argv[3:6] == [b"corral-wrapper", b"/", b"-"]:
            found.append(int(pid))
    return found


async def _one_spare(cluster: LiveCluster, agent_pid: int, other_than: int = 0) -> int:
    """The agent's one spare (a new one, when `other_than` names the last)."""

    async def there() -> bool:
        spares = await asyncio.to_thread(_spares, agent_pid)
        return len(spares) == 1 and spares[0] != other_than

    await poll(there, what="the agent's spare", log=cluster)
    (spare,) = await asyncio.to_thread(_spares, agent_pid)
    return spare


async def test_a_lone_job_runs_in_the_spare_the_agent_made_before_it(
    database_url: str, tmp_path: Path
) -> None:
    """The agent says it keeps a spare and has one before any job; a job submitted alone runs
    under that spare's wrapper and succeeds; a new spare follows; stopped, the agent leaves no
    spare process nor spare cgroup behind."""
    async with live_cluster(database_url, tmp_path) as cluster:
        cluster.start_agent("node-a", "cpu=4,mem=4g")
        await cluster.wait_agents_alive({"node-a"})
        if SPARE_NOTE not in cluster.agent_log("node-a"):
            reason = "this host's cgroup joins do not wait (or it has no cgroups): no spare"
            if IN_CI:
                pytest.fail(f"{reason}; the CI machines have cgroup v1 and no favordynmods")
            pytest.skip(reason)
        agent = cluster.agents["node-a"]
        spare = await _one_spare(cluster, agent.pid)
        sid = await cluster.submit(
            image="shell", command=["echo $PPID"], resources={"cpu": 1, "mem": "256m"}
        )
        row = await cluster.wait_status(sid)
        assert (row["status"], row["result"]) == (SessionStatus.TERMINATED, "success"), row
        (kernel,) = await cluster.kernels(sid)
        stdout = await read_log(cluster.db, KernelId(kernel["id"]), "stdout")
        assert stdout == f"{spare}\n".encode()  # the kernel's parent: the spare's wrapper
        replacement = await _one_spare(cluster, agent.pid, other_than=spare)
        cgroups: set[str] = set()

        async def joined() -> bool:  # the spare's kernel side waits in cgroups of its own
            cgroups.update(await asyncio.to_thread(_spare_cgroups, replacement))
            return bool(cgroups)

        # Its wrapper is there a moment before its kernel side is forked and has joined them.
        await poll(joined, what="the new spare in its cgroups", log=cluster)

        agent.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(agent.wait, 30) == 0
        assert not await asyncio.to_thread(Path(f"/proc/{replacement}").exists)
        assert not await asyncio.to_thread(lambda: [c for c in cgroups if _exists(c)])


def _spare_cgroups(wrapper: int) -> set[str]:
    """The names of the cgroups the spare's kernel side (the wrapper's child) waits in; none
    while it is not forked yet or has not joined them."""
    children = Path(f"/proc/{wrapper}/task/{wrapper}/children").read_text().split()
    if len(children) != 1:
        return set()
    lines = Path(f"/proc/{children[0]}/cgroup").read_text().splitlines()
    return {line.rsplit("/", 1)[-1] for line in lines if SPARE_PREFIX in line}


def _exists(name: str) -> bool:
    return any(path.is_dir() for path in Path("/sys/fs/cgroup").rglob(name))
