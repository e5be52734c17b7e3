"""The CLI as a user runs it: `--version`, and every error as one `corral: error:` line."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.e2e._cli import corral
from tests.e2e._up import Up, _home_env, start_up

USAGE_EXIT = 2
FAILURE_EXIT = 1


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """A user with nothing configured."""
    return _home_env(tmp_path)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    """`corral up` with one local agent."""
    yield from start_up(tmp_path)


def one_error_line(stderr: str) -> str:
    """The message of stderr's only line, which must be `corral: error: ...`: no box, no trace."""
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("corral: error: "), stderr
    assert "Traceback" not in stderr and "╭" not in stderr, stderr
    return lines[0].removeprefix("corral: error: ")


def free_port() -> int:
    """A local port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.mark.parametrize("args", [("--version",), ("version",)])
def test_version_prints_the_package_version(env: dict[str, str], args: tuple[str, ...]) -> None:
    """`corral --version` and `corral version` print the installed package's version, exit 0."""
    done = corral(*args, env=env)
    assert (done.returncode, done.stdout, done.stderr) == (0, f"corral {version('corral')}\n", "")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("run", "--bogus", "--", "true"),
            "no such option: --bogus",
        ),
        (("nosuch",), "no such command 'nosuch'; see `corral --help`"),
        (
            ("run", "--gpus", "-1", "--", "true"),
            "--gpus: must be 0 or more (got -1); see `corral run",
        ),
        (("run", "--gpus", "two", "--", "true"), "--gpus: must be a whole number (got two)"),
        (("run",), "missing argument 'CMD'; see `corral run --help`"),
        (("session", "info"), "missing argument 'SESSION'; see `corral session info --help`"),
        (("run", "--priority", "500", "--", "true"), "--priority: must be 100 or less"),
        (
            ("run", "--mem", "4x", "--", "true"),
            "--mem 4x: unknown unit 'x' in '4x'; mem takes bytes like 4294967296, or a size like "
            "4Gi or 4GiB (4·2³⁰), 4G or 4GB (4·10⁹), or the old 4g (= 4Gi) and 512m (= 512Mi)",
        ),
        (("run", "--cpu", "2g", "--", "true"), "--cpu 2g: unknown unit 'g' in '2g'; cpu takes"),
        (("run", "--cpu", "-1", "--", "true"), "--cpu -1: must not be negative (got -1)"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    env: dict[str, str], args: tuple[str, ...], message: str
) -> None:
    """A bad flag, command or value: exit 2 and one `corral: error:` line saying what to fix."""
    done = corral(*args, env=env)
    assert done.returncode == USAGE_EXIT, done.stderr
    assert done.stdout == ""
    assert one_error_line(done.stderr).startswith(message)


def test_an_unreachable_server_exits_1_saying_so(env: dict[str, str]) -> None:
    """No server at the configured URL: exit 1, one line naming the URL and what to check."""
    url = f"http://127.0.0.1:{free_port()}"
    done = corral("session", "ls", env={**env, "CORRAL_URL": url, "CORRAL_TOKEN": "crl_x"})
    assert done.returncode == FAILURE_EXIT, done.stderr
    message = one_error_line(done.stderr)
    assert message.startswith(f"cannot reach corral at {url}")
    assert message.endswith("is the manager running (`corral up`), and is the URL right?")


class _NotCorral(BaseHTTPRequestHandler):
    """A server that answers every request 200 with JSON that is not what corral sends."""

    def do_GET(self) -> None:
        body = b'{"surprise": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""


@pytest.fixture
def not_corral() -> Iterator[str]:
    """The URL of a server answering 200 with JSON corral does not expect."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NotCorral)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_answer_without_what_session_ls_reads_says_so_and_exits_1(
    env: dict[str, str], not_corral: str
) -> None:
    """`session ls` (plain JSON) reading a server that is not corral: one line naming the
    request, what it lacked and the URL to check, exit 1."""
    done = corral("session", "ls", env={**env, "CORRAL_URL": not_corral, "CORRAL_TOKEN": "crl_x"})
    assert done.returncode == FAILURE_EXIT, done.stderr
    assert one_error_line(done.stderr) == (
        "GET /v1/me answered without what corral expects (KeyError: 'name'); "
        f"is {not_corral} a corral manager?"
    )


@pytest.mark.parametrize("args", [("session", "info", "1"), ("events",)])
def test_an_unexpected_error_is_one_line_with_a_hint_and_exits_1(
    env: dict[str, str], not_corral: str, args: tuple[str, ...]
) -> None:
    """An answer corral cannot read is no traceback: `corral: error: <type>: <message>` and a
    hint to set CORRAL_DEBUG=1, exit 1; with CORRAL_DEBUG=1 the traceback is shown."""
    user = {**env, "CORRAL_URL": not_corral, "CORRAL_TOKEN": "crl_x"}
    done = corral(*args, env=user)
    assert done.returncode == FAILURE_EXIT, done.stderr
    first, hint = done.stderr.splitlines()
    assert first.startswith("corral: error: ValidationError: "), done.stderr
    assert hint == "corral: run it again with CORRAL_DEBUG=1 to see where"
    assert "Traceback" not in done.stderr and "╭" not in done.stderr
    debug = corral(*args, env={**user, "CORRAL_DEBUG": "1"})
    assert debug.returncode == FAILURE_EXIT
    assert "Traceback (most recent call last)" in debug.stderr


@pytest.mark.parametrize(
    "args",
    [("run", "--", "true"), ("run", "-d", "--", "true"), ("events",), ("submit", "job.yaml")],
)
def test_every_user_verb_names_the_unreachable_url(
    env: dict[str, str], tmp_path: Path, args: tuple[str, ...]
) -> None:
    """`run` (followed or detached: the SDK's client or one plain request), `events` and
    `submit` with no manager at the URL: exit 1 naming it, `corral up`."""
    (tmp_path / "job.yaml").write_text("command: [python, -c, pass]\n")
    url = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [sys.executable, "-m", "corral", *args],
        env={**env, "CORRAL_URL": url, "CORRAL_TOKEN": "crl_x"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == FAILURE_EXIT, done.stderr
    message = one_error_line(done.stderr)
    assert message.startswith(f"cannot reach corral at {url}")
    assert "(`corral up`)" in message


def test_server_errors_and_quantities_through_a_real_manager(up: Up) -> None:
    """A server-side 422 is a usage error in our words; `--mem 512m` is 512 MiB, `--cpu 500m`
    half a core; `--json` shows slots as numbers in base units, for sessions and agents."""
    refused = up.corral("run", "--resource-group", "nowhere", "--", "true")
    assert refused.returncode == USAGE_EXIT, refused.stderr
    assert one_error_line(refused.stderr) == (
        "resource_group: resource group 'nowhere' does not exist"
    )
    missing = up.corral("session", "info", "00000000-0000-0000-0000-000000000000")
    assert missing.returncode == FAILURE_EXIT, missing.stderr
    one_error_line(missing.stderr)

    # `run -d` sends one plain request and leaves the checks to the server: what it refuses is
    # named by the flag all the same, a usage error, and nothing is created.
    detached = up.corral("run", "-d", "--priority", "500", "--retries", "1", "--", "true")
    assert detached.returncode == USAGE_EXIT, detached.stderr
    assert one_error_line(detached.stderr) == "--priority: must be 100 or less"
    assert json.loads(up.corral("session", "ls", "--all-states", "--json").stdout) == []
    submitted = up.corral("run", "-d", "--cpu", "500m", "--mem", "512m", "--", "true")
    assert submitted.returncode == 0, submitted.stderr
    session_id = submitted.stdout.strip()
    info = json.loads(up.corral("session", "info", session_id, "--json").stdout)
    assert info["resources"] == {"cpu": 0.5, "mem": 512 * 1024**2}
    listed = json.loads(up.corral("session", "ls", "--all-states", "--json").stdout)
    assert [s["resources"] for s in listed] == [{"cpu": 0.5, "mem": 512 * 1024**2}]
    shown = up.corral("session", "info", session_id)
    assert "cpu=0.5 mem=512MiB per kernel" in shown.stdout
    decimal = up.corral("run", "-d", "--mem", "1G", "--", "true")
    decimal_info = json.loads(up.corral("session", "info", decimal.stdout.strip(), "--json").stdout)
    assert decimal_info["resources"] == {"cpu": 1, "mem": 10**9}
    # Two sessions made a moment apart share their ids' first digits (UUIDv7): a prefix of
    # both is a reference to retype, a usage error naming both numbers.
    prefix = info["id"][:4]  # 16 bits of a millisecond time: the same for 50 days
    assert decimal_info["id"].startswith(prefix)
    ambiguous = up.corral("session", "info", prefix)
    assert ambiguous.returncode == USAGE_EXIT, ambiguous.stderr
    said = one_error_line(ambiguous.stderr)
    assert said.startswith(f"id prefix '{prefix}' fits several sessions (")
    assert f"{info['number']}, {decimal_info['number']}" in said

    (agent,) = json.loads(up.corral("agent", "ls", "--json").stdout)
    assert set(agent["capacity"]) >= {"cpu", "mem"}
    assert all(isinstance(amount, int | float) for amount in agent["capacity"].values())
    assert isinstance(agent["capacity"]["mem"], int)
