"""End to end, the kernel restart policy (issue 36): a real manager, one `corral agent`
process, and the CLI. A job that fails its first run and succeeds its second, submitted with
`corral run --restart-limit 1`, is restarted on its agent and ends TERMINATED success, its one
restart shown by `corral session info` and its two runs' output in one log."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from corral.domain.status import SessionStatus
from corral.store.users import create_user, issue_token
from tests.e2e._cli import corral
from tests.e2e._cluster import live_cluster, poll

pytestmark = pytest.mark.timeout(300)
S = SessionStatus
_BASE_ENV = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
# Fails (exit 3) the first time, leaving a marker; succeeds when the marker is there.
_FAILS_ONCE = """
import pathlib, sys
marker = pathlib.Path(sys.argv[1])
if not marker.exists():
    marker.touch()
    print("first run fails", flush=True)
    sys.exit(3)
print("second run succeeds", flush=True)
"""


async def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`corral ARGS` in a thread: the manager serves from this process's event loop."""
    return await asyncio.to_thread(corral, *args, env=env)


async def _ok(env: dict[str, str], *args: str) -> str:
    done = await _run(env, *args)
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout


async def test_a_job_that_fails_once_is_restarted_and_succeeds(
    database_url: str, tmp_path: Path
) -> None:
    async with live_cluster(database_url, tmp_path) as cluster:
        cluster.start_agent("node-a", "cpu=1,mem=1g", address="127.0.0.1")
        await cluster.wait_agents_alive({"node-a"})
        now = datetime.now(UTC)
        user = await create_user(cluster.db, "restarter", "user", now)
        token = await issue_token(cluster.db, user, "e2e", now)
        env = {
            **_BASE_ENV,
            "CORRAL_CONFIG": str(tmp_path / "none.toml"),
            "HOME": str(tmp_path),
            "XDG_CONFIG_HOME": str(tmp_path / ".config"),
            "CORRAL_URL": cluster.manager.url,
            "CORRAL_TOKEN": token.secret,
        }
        marker = tmp_path / "failed-once"
        number = (
            await _ok(
                env,
                "run",
                "--restart-limit",
                "1",
                "--detach",
                "--cpu",
                "1",
                "--mem",
                "256m",
                "--",
                "python",
                "-c",
                _FAILS_ONCE,
                str(marker),
            )
        ).strip()
        shown: dict[str, Any] = {}

        async def ended() -> bool:
            nonlocal shown
            shown = json.loads(await _ok(env, "session", "info", number, "--json"))
            return shown["status"] in (S.TERMINATED, S.ERROR, S.CANCELLED)

        await poll(ended, what="the restarted job to end", log=cluster)
        assert (shown["status"], shown["result"], shown["exit_code"]) == (
            S.TERMINATED,
            "success",
            0,
        ), shown
        assert (shown["restart_limit"], shown["restarts"]) == (1, 1)
        assert [(k["restarts"], k["restarting"]) for k in shown["kernels"]] == [(1, False)]
        assert marker.exists()
        info = await _ok(env, "session", "info", number)
        assert "up to 1 per kernel; 1 made" in info, info
        logs = await _ok(env, "session", "logs", number)
        assert logs.splitlines() == ["first run fails", "second run succeeds"], logs
        events = json.loads(await _ok(env, "events", "--session", number, "--json"))
        kinds = [e["kind"] for e in events if e["kind"] != "session.status_changed"]
        assert "session.kernel_restarting" in kinds and "session.recovered" in kinds
