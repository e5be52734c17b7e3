"""A live cluster for end-to-end tests: a manager in this process, agents as real processes.

The manager is the real daemon (API over real HTTP on a free port, coordinator loops, lost
sweep); each agent is `python -m corral agent ...`, a separate process with the process
runtime, talking to the manager over HTTP. Sessions are submitted through the manager's
session controller (the user API arrives with issue 6).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Collection
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from corral.controller.agents import AgentTimings
from corral.domain.spec import SessionSpec
from corral.domain.status import SessionStatus
from corral.domain.types import SessionId, UserId
from corral.manager.daemon import ManagerConfig, ManagerDaemon
from corral.store.database import Database
from corral.store.tables import agents, kernels, sessions, users
from corral.store.users import create_user, issue_token

JOIN_TOKEN = "e2e-join-token"
# Generous: under the parallel suite a loaded machine has starved an agent (or the manager's
# loop) for over 4 s; a test that waits for a loss passes its own, shorter timeout.
HEARTBEAT_TIMEOUT_S = 20.0
DEADLINE_S = 60.0
_ENDED = frozenset({SessionStatus.TERMINATED, SessionStatus.ERROR, SessionStatus.CANCELLED})


@dataclass
class LiveCluster:
    """The manager, its database, a user, and the agent processes started so far."""

    manager: ManagerDaemon
    runner: asyncio.Task[None]
    db: Database
    owner: UserId
    tmp_path: Path
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    more_managers: list[tuple[ManagerDaemon, asyncio.Task[None]]] = field(default_factory=list)

    async def restart_manager(self) -> None:
        """Stop the manager and start a new one on the same database and port."""
        config = replace(self.manager.config, port=int(self.manager.url.rsplit(":", 1)[1]))
        await self.manager.stop()
        await self.runner
        self.manager, self.runner = await _start(config)
        assert self.manager.parts is not None
        self.db = self.manager.parts.db

    async def start_manager(self, port: int = 0) -> tuple[ManagerDaemon, asyncio.Task[None]]:
        """Another manager on the same database, hints and join token (stopped at the end)."""
        started = await _start(replace(self.manager.config, port=port))
        self.more_managers.append(started)
        return started

    def start_agent(
        self,
        agent_id: str,
        slots: str,
        *args: str,
        address: str = "127.0.0.1",
        managers: Collection[str] = (),
    ) -> None:
        """Start `corral agent` as a process; its log goes to <tmp>/<agent_id>.log.

        `managers`: the URLs it is given (default: this cluster's manager).
        """
        log = (self.tmp_path / f"{agent_id}.log").open("wb")
        self.agents[agent_id] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "corral",
                "agent",
                "--manager",
                ",".join(managers or [self.manager.url]),
                "--token",
                JOIN_TOKEN,
                "--id",
                agent_id,
                "--address",
                address,
                "--slots",
                slots,
                "--data-dir",
                str(self.agent_dir(agent_id)),
                "--stop-grace",
                "2",
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "CORRAL_DATA_DIR": str(self.tmp_path / "data")},
        )
        log.close()

    def agent_dir(self, agent_id: str) -> Path:
        """The agent's data directory (kernels' work dirs are under kernels/<id>)."""
        return self.tmp_path / "agents" / agent_id

    def agent_log(self, agent_id: str) -> str:
        """What the agent process wrote so far."""
        return (self.tmp_path / f"{agent_id}.log").read_text(errors="replace")

    async def wait_agents_alive(self, agent_ids: Collection[str]) -> None:
        """Until every agent registered and is ALIVE."""

        async def alive() -> bool:
            async with self.db.read() as conn:
                rows = await conn.execute(sa.select(agents.c.id, agents.c.status))
                return {a for a, s in rows if s == "ALIVE"} >= set(agent_ids)

        await poll(alive, what=f"agents {sorted(agent_ids)} to register")

    async def submit(self, **spec: Any) -> SessionId:
        """Submit a session as the test user."""
        return await self.submit_as(self.owner, **spec)

    async def submit_as(self, owner: UserId, **spec: Any) -> SessionId:
        """Submit a session as `owner` (see add_user)."""
        assert self.manager.parts is not None
        submitted = await self.manager.parts.sessions.enqueue(
            SessionSpec.model_validate(spec), owner
        )
        return submitted.session_id

    async def add_user(self, name: str) -> UserId:
        """Another plain user named `name`."""
        user = UserId(uuid.uuid4())
        async with self.db.transaction() as conn:
            await conn.execute(
                users.insert(),
                [{"id": user, "name": name, "role": "user", "created_at": datetime.now(UTC)}],
            )
        return user

    def admin_api(self) -> AbstractAsyncContextManager[httpx.AsyncClient]:
        """An HTTP client of the manager's API, as a new admin user: the path an admin takes."""
        return _admin_client(self)

    async def session(self, session_id: SessionId) -> dict[str, Any]:
        """The session's row."""
        async with self.db.read() as conn:
            row = (await conn.execute(sa.select(sessions).where(sessions.c.id == session_id))).one()
        return dict(row._mapping)

    async def kernels(self, session_id: SessionId) -> list[dict[str, Any]]:
        """The session's kernel rows, by cluster index."""
        async with self.db.read() as conn:
            rows = await conn.execute(
                sa.select(kernels)
                .where(kernels.c.session_id == session_id)
                .order_by(kernels.c.cluster_index)
            )
        return [dict(r._mapping) for r in rows]

    async def wait_status(
        self, session_id: SessionId, statuses: Collection[SessionStatus] = _ENDED
    ) -> dict[str, Any]:
        """Until the session is in one of `statuses`; its row."""
        wanted = {s.value for s in statuses}
        row: dict[str, Any] = {}

        async def reached() -> bool:
            nonlocal row
            row = await self.session(session_id)
            return row["status"] in wanted

        await poll(reached, what=f"session {session_id} to reach {sorted(wanted)}", log=self)
        return row


@asynccontextmanager
async def _admin_client(cluster: LiveCluster) -> AsyncIterator[httpx.AsyncClient]:
    now = datetime.now(UTC)
    admin = await create_user(cluster.db, f"admin-{uuid.uuid4().hex[:8]}", "admin", now)
    token = await issue_token(cluster.db, admin, "e2e", now)
    headers = {"Authorization": f"Bearer {token.secret}"}
    async with httpx.AsyncClient(base_url=cluster.manager.url, headers=headers, timeout=30) as c:
        yield c


async def poll(
    condition: Any, *, what: str, deadline_s: float = DEADLINE_S, log: LiveCluster | None = None
) -> None:
    """Await `condition()` until it is true; fail naming `what` after the deadline."""
    end = time.monotonic() + deadline_s
    while not await condition():
        if time.monotonic() > end:
            logs = ""
            if log is not None:
                logs = "\n".join(f"--- {a}:\n{log.agent_log(a)[-3000:]}" for a in log.agents)
            raise AssertionError(f"timed out waiting for {what}\n{logs}")
        await asyncio.sleep(0.05)


async def _start(config: ManagerConfig) -> tuple[ManagerDaemon, asyncio.Task[None]]:
    daemon = ManagerDaemon(config)
    return daemon, await daemon.start()


@asynccontextmanager
async def live_cluster(
    database_url: str,
    tmp_path: Path,
    *,
    heartbeat_timeout_s: float = HEARTBEAT_TIMEOUT_S,
    running_quiet_s: float = AgentTimings().running_quiet_s,
) -> AsyncIterator[LiveCluster]:
    """A running manager on `database_url`; agents are started by the test and killed after."""
    daemon, runner = await _start(
        ManagerConfig(
            database_url=database_url,
            port=0,
            join_token=JOIN_TOKEN,
            prefix=f"e2e{uuid.uuid4().hex[:8]}",
            timings=AgentTimings(
                heartbeat_timeout_s=heartbeat_timeout_s,
                assignment_wait_s=10,
                running_quiet_s=running_quiet_s,
            ),
            grace_period_s=2,
        )
    )
    assert daemon.parts is not None
    owner = UserId(uuid.uuid4())
    async with daemon.parts.db.transaction() as conn:
        await conn.execute(
            users.insert(),
            [{"id": owner, "name": "e2e", "role": "user", "created_at": datetime.now(UTC)}],
        )
    cluster = LiveCluster(daemon, runner, daemon.parts.db, owner, tmp_path)
    try:
        yield cluster
    finally:
        for process in cluster.agents.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in cluster.agents.values():
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for manager, runner in [(cluster.manager, cluster.runner), *cluster.more_managers]:
            await manager.stop()
            await runner
