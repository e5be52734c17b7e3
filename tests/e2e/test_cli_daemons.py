"""`corral manager` and `corral agent` as processes: start, serve, stop on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from corral.testing.redis_server import RedisServer

_ENV = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}


def _start_manager(tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    """A manager on a fresh SQLite file and a free port; its URL from its first line."""
    process = _manager_process(tmp_path)
    assert process.stderr is not None
    for line in process.stderr:
        if "listening on" in line:
            return process, line.rsplit(" ", 1)[-1].strip()
    raise AssertionError(f"the manager exited with {process.wait()} before listening")


def _manager_process(tmp_path: Path, *options: str) -> subprocess.Popen[str]:
    """`corral manager` on a fresh SQLite file and a free port, its stderr piped."""
    return subprocess.Popen(
        [
            sys.executable, "-m", "corral", "manager",
            "--database", f"sqlite:///{tmp_path / 'corral.db'}",
            "--port", "0",
            "--heartbeat-timeout", "5",
            "--log-level", "WARNING",
            *options,
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={
            **_ENV,
            "CORRAL_CONFIG": str(tmp_path / "none.toml"),
            "CORRAL_DATA_DIR": str(tmp_path / "data"),
        },
    )  # fmt: skip


def _line_with(process: subprocess.Popen[str], text: str) -> str:
    """The first line of the process's stderr from here on that holds `text`."""
    assert process.stderr is not None
    for line in process.stderr:
        if text in line:
            return line
    raise AssertionError(f"the manager exited with {process.wait()} before saying {text!r}")


def test_a_manager_started_while_its_redis_is_down_waits_and_comes_up_with_it(
    tmp_path: Path,
) -> None:
    """Redis down at start: the manager says it waits, does not exit (it used to, at once, so
    a restart during an outage was a crash loop), and listens once Redis is up."""
    redis = RedisServer(tmp_path / "redis")  # not started yet: its port refuses
    manager = _manager_process(tmp_path, "--redis", redis.url)
    try:
        waiting = _line_with(manager, "manager.waiting_for_servers")
        assert "ConnectionError" in waiting
        assert manager.poll() is None
        redis.start()
        url = _line_with(manager, "listening on").rsplit(" ", 1)[-1].strip()
        assert httpx.get(f"{url}/readyz", timeout=10).status_code == 200
        _stop(manager)
    finally:
        manager.kill()
        redis.kill()


def test_a_manager_waiting_for_its_servers_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    """SIGTERM while it waits for Redis: the manager ends at once with exit code 0."""
    redis = RedisServer(tmp_path / "redis")
    manager = _manager_process(tmp_path, "--redis", redis.url)
    try:
        _line_with(manager, "manager.waiting_for_servers")
        _stop(manager)
    finally:
        manager.kill()


def test_manager_prints_a_join_token_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    """No join token configured: one is made, kept in a 0600 file; /healthz answers; SIGTERM."""
    manager, url = _start_manager(tmp_path)
    try:
        token = _join_token(manager, tmp_path)
        assert httpx.get(f"{url}/healthz", timeout=10).json() == {"status": "ok"}
        refused = httpx.post(
            f"{url}/v1/agents/register",
            json={"agent_id": "a", "address": "h", "slots": {"cpu": 1}},
            headers={"Authorization": "Bearer wrong"},
            timeout=10,
        )
        assert refused.status_code == 401
        agent = subprocess.run(
            [
                sys.executable, "-m", "corral", "agent", "--manager", url, "--token", token,
                "--slots", "cpu=1,mem=1g", "--id", "cli-agent", "--data-dir", str(tmp_path / "a"),
                "--runtime", "nonsense",
            ],
            capture_output=True, text=True, env=_ENV, timeout=60, check=False,
        )  # fmt: skip
        assert agent.returncode == 2
        assert "--runtime must be `process` or `simulated`" in agent.stderr
    finally:
        _stop(manager)


def test_agent_joins_and_leaves_cleanly_on_sigterm(tmp_path: Path) -> None:
    """An agent registers (its token saved 0600), and SIGTERM stops it with exit code 0."""
    manager, url = _start_manager(tmp_path)
    try:
        token = _join_token(manager, tmp_path)
        agent = subprocess.Popen(
            [
                sys.executable, "-m", "corral", "agent", "--manager", url, "--token", token,
                "--slots", "cpu=1,mem=1g", "--id", "cli-agent", "--data-dir", str(tmp_path / "a"),
            ],
            stderr=subprocess.PIPE, text=True, env=_ENV,
        )  # fmt: skip
        assert agent.stderr is not None
        for line in agent.stderr:
            if "agent.registered" in line and "new_token=True" in line:
                break
        token_file = tmp_path / "a" / "agent-token"
        assert token_file.stat().st_mode & 0o777 == 0o600
        assert token not in token_file.read_text()  # its own token, not the join token
        _stop(agent)
    finally:
        _stop(manager)


def test_a_bad_simulated_latency_is_refused_naming_its_flag(tmp_path: Path) -> None:
    """`--sim-run-time 3-1s` (low above high) stops the agent at once, naming the flag."""
    agent = subprocess.run(
        [
            sys.executable, "-m", "corral", "agent", "--manager", "http://127.0.0.1:1",
            "--token", "t", "--slots", "cpu=1,mem=1g", "--id", "sim",
            "--data-dir", str(tmp_path / "a"), "--runtime", "simulated",
            "--sim-run-time", "3-1s",
        ],
        capture_output=True, text=True, env=_ENV, timeout=60, check=False,
    )  # fmt: skip
    assert agent.returncode == 2
    assert "--sim-run-time: invalid latency '3-1s'" in agent.stderr
    assert "low_s (3.0) must not be above high_s (1.0)" in agent.stderr


def _join_token(manager: subprocess.Popen[str], tmp_path: Path) -> str:
    """The generated join token: its file is named on the console, the token itself is not."""
    assert manager.stderr is not None
    line = manager.stderr.readline()
    path = tmp_path / "data" / "join-token"
    assert line.strip() == f"agent join token written to {path}"
    assert path.stat().st_mode & 0o777 == 0o600
    return path.read_text().strip()


def _stop(process: subprocess.Popen[str]) -> None:
    """SIGTERM, and the process ends by itself with exit code 0."""
    process.send_signal(signal.SIGTERM)
    try:
        assert process.wait(timeout=30) == 0
    finally:
        if process.stderr is not None:
            process.stderr.close()
