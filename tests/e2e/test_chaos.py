"""`corral chaos` as a user runs it: real managers killed under load, every check passing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import POSTGRES_URL, require_server
from tests.e2e._cli import corral

# A 300-session run takes well under a minute alone; the machine running the suite is shared.
pytestmark = pytest.mark.timeout(240)

CHECKS = {
    "every_accepted_session_terminal",
    "no_kernel_started_twice",
    "no_overcommit",
    "ledger_equals_kernel_slots",
    "every_history_edge_legal",
    "no_process_exited_by_itself",
}


def test_sessions_survive_manager_kills_on_postgresql(
    tmp_path: Path, postgres_unreachable: str | None
) -> None:
    """2 managers, 4 agents, 300 sessions, 3 manager SIGKILLs: every check reports 0."""
    require_server("PostgreSQL", postgres_unreachable)
    env = {**os.environ, "CORRAL_CONFIG": str(tmp_path / "none.toml")}
    result = corral(
        "chaos",
        "--managers", "2",
        "--agents", "4",
        "--sessions", "300",
        "--kill-every", "2s",
        "--max-kills", "3",
        "--agent-slots", "cpu=8,mem=16g",
        "--run-time", "0.2-0.6s",
        "--database", POSTGRES_URL,
        "--timeout", "200",
        "--json",
        env=env,
        timeout_s=220,
    )  # fmt: skip
    assert result.stdout, result.stderr[-3000:]
    report = json.loads(result.stdout)
    failed = {c["name"]: c["examples"] for c in report["checks"] if c["violations"]}
    assert not failed, failed
    assert result.returncode == 0, result.stderr[-3000:]
    assert {c["name"] for c in report["checks"]} == CHECKS
    assert all(c["checked"] > 0 for c in report["checks"])
    assert report["accepted"] == 300
    assert report["database"] == "postgresql"
    assert report["manager_kills"] == 3
    assert report["manager_restarts"] == 3
    assert report["violations"] == 0


def test_a_run_that_cannot_start_says_why_and_leaves_nothing(tmp_path: Path) -> None:
    """`--fault pg` on SQLite is refused with a message and a non-zero exit, not a traceback."""
    env = {**os.environ, "CORRAL_CONFIG": str(tmp_path / "none.toml")}
    result = corral(
        "chaos", "--managers", "1", "--agents", "1", "--sessions", "1", "--fault", "pg",
        env=env, timeout_s=60,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "--fault pg needs a postgresql:// --database" in result.stderr
    assert "Traceback" not in result.stderr
