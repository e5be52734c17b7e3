"""`corral deploy` as a user runs it, with `corral up`: replicas of a small Python HTTP server
come up as processes on the port the agent gave them, are replaced when they die, scale, and
end when the deployment is removed."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e._up import Up, start_up

SERVER = """
import os
import pathlib
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(os.environ["CORRAL_PORT"])
RELEASE = pathlib.Path(os.environ["RELEASE_FILE"])


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        if self.path == "/stream":
            # The first chunk at once, the second only once the test saw the first.
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for chunk, wait in ((b"first\\n", False), (b"second\\n", True)):
                while wait and not RELEASE.exists():
                    time.sleep(0.05)
                self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\\r\\n\\r\\n")
            return
        body = f"replica on {PORT} v{os.environ.get('VERSION', '1')}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
"""

DEADLINE_S = 60.0
# Every poll is a `corral` process: on a loaded 2-core machine the whole story takes minutes.
pytestmark = pytest.mark.timeout(400)


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    """`corral up` with one local agent."""
    yield from start_up(tmp_path)


def _until(what: str, check: Callable[[], Any], deadline_s: float = DEADLINE_S) -> Any:
    """Poll `check` until it returns something true; its value."""
    end = time.monotonic() + deadline_s
    last: Any = None
    while time.monotonic() < end:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"{what}: not within {deadline_s} s; last seen {last!r}")


def _info(up: Up, name: str) -> dict[str, Any]:
    """What `corral deploy info NAME --json` prints, read from the API it calls: polled many
    times, a `corral` process each time would make the story minutes long."""
    request = urllib.request.Request(
        f"{up.said_after('corral is up at ')}/v1/deployments/{urllib.parse.quote(name)}",
        headers={"Authorization": f"Bearer {up.said_after('admin token: ')}"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        found: dict[str, Any] = json.loads(answer.read())
    return found


def _serving(up: Up, name: str, count: int) -> list[dict[str, Any]] | None:
    """The deployment's routes once exactly `count` pass their health check, else None (a
    DEGRADED replica runs but may not listen yet)."""
    found = _info(up, name)
    up_routes = [r for r in found["routes"] if r["status"] == "healthy"]
    live = [r for r in found["routes"] if r["status"] not in ("terminated",)]
    if found["lifecycle"] == "ready" and len(up_routes) == count == len(live):
        return up_routes
    return None


def _get(host: str, port: int) -> str:
    with urllib.request.urlopen(f"http://{host}:{port}/", timeout=5) as answer:
        body: bytes = answer.read()
        return body.decode()


def test_deploy_serves_replaces_scales_and_removes(up: Up, tmp_path: Path) -> None:
    """Two replicas serve on their own ports; one killed is replaced; 2 → 3 → 1; rm ends all."""
    server = tmp_path / "server.py"
    server.write_text(SERVER)
    created = up.corral(
        "deploy", "create", "web", "--replicas", "2", "--cpu", "0.25", "--mem", "64m",
        "--health-interval", "1", "-e", f"RELEASE_FILE={tmp_path / 'release'}", "--json",
        "--access", "open", "--", "python", str(server),
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["lifecycle"] == "pending"

    routes = _until("2 replicas serving", lambda: _serving(up, "web", 2))
    ports = {r["port"] for r in routes}
    assert len(ports) == 2
    for route in routes:
        assert _get(route["host"], route["port"]) == f"replica on {route['port']} v1"

    # The same deployment through the proxy `corral up` runs beside the manager.
    (served,) = [line for line in up.said if line.startswith("deployments served at ")]
    proxy_url = served.split()[3].removesuffix("/<deployment>/")
    _until("served by corral up's proxy", lambda: _through(f"{proxy_url}/web/")[0] == 200)

    listed = up.corral("deploy", "ls", "--json")
    assert [d["name"] for d in json.loads(listed.stdout)] == ["web"]
    table = up.corral("deploy", "info", "web")
    assert table.returncode == 0
    assert all(f":{p}" in table.stdout for p in ports)

    cli = json.loads(up.corral("deploy", "info", "web", "--json").stdout)
    assert {r["port"] for r in cli["routes"]} == ports  # the CLI prints what the API says

    # Kill one replica's process: its route ends and a replacement serves.
    victim = routes[0]
    session = json.loads(up.corral("session", "info", str(victim["session_id"]), "--json").stdout)
    os.killpg(session["kernels"][0]["runtime_info"]["pid"], signal.SIGKILL)

    def replaced() -> list[dict[str, Any]] | None:
        serving = _serving(up, "web", 2)
        if serving and victim["id"] not in {r["id"] for r in serving}:
            return serving
        return None

    routes = _until("the killed replica replaced", replaced)
    for route in routes:
        assert _get(route["host"], route["port"]) == f"replica on {route['port']} v1"
    ended = [r for r in _info(up, "web")["routes"] if r["id"] == victim["id"]]
    assert ended[0]["status"] == "terminated"

    assert up.corral("deploy", "scale", "web", "3").returncode == 0
    _until("3 replicas serving", lambda: _serving(up, "web", 3))
    assert up.corral("deploy", "scale", "web", "1").returncode == 0
    (last,) = _until("1 replica serving", lambda: _serving(up, "web", 1))
    assert _get(last["host"], last["port"]) == f"replica on {last['port']} v1"

    removed = up.corral("deploy", "rm", "web", "--json")
    assert json.loads(removed.stdout)["lifecycle"] == "destroying"
    final = _until("destroyed", lambda: (d := _info(up, "web"))["lifecycle"] == "destroyed" and d)
    assert {r["status"] for r in final["routes"]} == {"terminated"}
    for route in final["routes"]:
        info = json.loads(up.corral("session", "info", str(route["session_id"]), "--json").stdout)
        # The killed replica failed (ERROR); the others were ended.
        expected = ("ERROR",) if route["id"] == victim["id"] else ("TERMINATED", "CANCELLED")
        assert info["status"] in expected, (route, info["status"])


def test_deploy_create_refuses_a_bad_spec_naming_the_field(up: Up) -> None:
    """A bad health path is refused before anything is created, naming the field."""
    done = up.corral("deploy", "create", "web", "--health-path", "health", "--", "python", "x.py")
    assert done.returncode == 2
    assert "health_check.path" in done.stderr
    assert json.loads(up.corral("deploy", "ls", "--json").stdout) == []


@pytest.fixture
def proxy(up: Up) -> Iterator[str]:
    """`corral proxy --port 0` beside `corral up`; its base URL."""
    process = subprocess.Popen(
        [sys.executable, "-m", "corral", "proxy", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=up.env,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line.startswith("proxy listening on http://"), line
    try:
        yield line.removeprefix("proxy listening on ").strip()
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)
        process.stdout.close()


def _through(url: str, token: str | None = None) -> tuple[int, str]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=10
        ) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_proxy_balances_streams_and_survives_a_dead_replica(
    up: Up, proxy: str, tmp_path: Path
) -> None:
    """Through `corral proxy`, with the deployment's token (the default access): requests
    spread over both replicas, a chunked answer streams chunk by chunk, no request fails while
    a replica is killed, 503 once none is healthy."""
    server = tmp_path / "server.py"
    server.write_text(SERVER)
    created = up.corral(
        "deploy", "create", "web", "--replicas", "2", "--cpu", "0.25", "--mem", "64m",
        "--health-interval", "1", "-e", f"RELEASE_FILE={tmp_path / 'release'}",
        "--", "python", str(server),
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    (token,) = re.findall(r"\bcrld_\S+", created.stdout)
    url = f"{proxy}/web/"

    def both_served() -> set[str] | None:
        seen = {_through(url, token) for _ in range(6)}
        bodies = {body for status, body in seen if status == 200}
        return bodies if len(bodies) == 2 and all(s == 200 for s, _ in seen) else None

    _until("both replicas served through the proxy", both_served)

    # A chunked answer arrives chunk by chunk: the second is sent only after the first came.
    parsed = urllib.parse.urlsplit(proxy)
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    connection.request("GET", "/web/stream", headers={"Authorization": f"Bearer {token}"})
    streamed = connection.getresponse()
    assert streamed.readline() == b"first\n"
    (tmp_path / "release").touch()
    assert streamed.read() == b"second\n"
    connection.close()

    # Kill a replica while requests keep coming: each is served by a replica that can.
    routes = _until("2 healthy", lambda: _healthy(up, "web", 2))
    session = json.loads(
        up.corral("session", "info", str(routes[0]["session_id"]), "--json").stdout
    )
    os.killpg(session["kernels"][0]["runtime_info"]["pid"], signal.SIGKILL)
    for _ in range(20):
        status, body = _through(url, token)
        assert status == 200, body
    _until("a replacement healthy", lambda: _healthy(up, "web", 2))

    # A rolling update: every request answered meanwhile, then only the new version answers.
    release = f"RELEASE_FILE={tmp_path / 'release'}"
    updated = up.corral("deploy", "update", "web", "-e", release, "-e", "VERSION=2", "--json")
    assert updated.returncode == 0, updated.stderr
    assert json.loads(updated.stdout)["lifecycle"] == "deploying"

    def rolled_out() -> bool:
        status, body = _through(url, token)
        assert status == 200, body
        return body.endswith(" v2") and _info(up, "web")["lifecycle"] == "ready"

    _until("the update rolled out", rolled_out, deadline_s=120)
    assert all(_through(url, token)[1].endswith(" v2") for _ in range(4))
    assert _through(url)[0] == 401  # without the token

    # `corral deploy token` makes a new token; the proxy soon takes it, and not the old one.
    rotated = up.corral("deploy", "token", "web")
    assert rotated.returncode == 0, rotated.stderr
    fresh = rotated.stdout.strip()
    assert fresh.startswith("crld_") and fresh != token
    _until("the new token taken", lambda: _through(url, fresh)[0] == 200)
    assert _through(url, token)[0] == 401
    token = fresh

    assert up.corral("deploy", "scale", "web", "0").returncode == 0

    def refused() -> dict[str, Any] | None:
        status, body = _through(url, token)
        return json.loads(body) if status == 503 else None

    problem = _until("503 with no replica", refused)
    assert problem["type"].endswith("/no-healthy-replica")


def _healthy(up: Up, name: str, count: int) -> list[dict[str, Any]] | None:
    routes = [r for r in _info(up, name)["routes"] if r["status"] == "healthy"]
    return routes if len(routes) == count else None


def test_autoscaling_through_corral_ups_proxy_and_draining(up: Up, tmp_path: Path) -> None:
    """`corral deploy create --max-replicas 3 --target-inflight 1`: three streams held open
    through `corral up`'s proxy (which reports its requests in flight) bring 3 replicas; once
    they end, the count goes back to 1 after the down delay, the replicas taken out drained
    (ended, not failed), and `corral deploy info` shows the policy."""
    server = tmp_path / "server.py"
    server.write_text(SERVER)
    created = up.corral(
        "deploy", "create", "auto", "--cpu", "0.25", "--mem", "64m", "--health-interval", "1",
        "-e", f"RELEASE_FILE={tmp_path / 'release'}", "--min-replicas", "1",
        "--max-replicas", "3", "--target-inflight", "1", "--upscale-delay", "0",
        "--downscale-delay", "2", "--drain-grace", "20", "--access", "open", "--json", "--",
        "python", str(server),
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["autoscaling"]["max_replicas"] == 3
    (served,) = [line for line in up.said if line.startswith("deployments served at ")]
    proxy = urllib.parse.urlsplit(served.split()[3].removesuffix("/<deployment>/"))
    _until("1 replica serving", lambda: _serving(up, "auto", 1))
    _until("served through the proxy", lambda: _through(f"{proxy.geturl()}/auto/")[0] == 200)

    streams = []
    for _ in range(3):  # each holds a request in flight until the release file exists
        connection = http.client.HTTPConnection(proxy.hostname, proxy.port, timeout=60)
        connection.request("GET", "/auto/stream")
        answer = connection.getresponse()
        assert answer.readline() == b"first\n"
        streams.append((connection, answer))
    routes = _until("3 replicas serving", lambda: _serving(up, "auto", 3), deadline_s=120)
    info = up.corral("deploy", "info", "auto")
    assert "1..3 replicas, 1 requests in flight each" in info.stdout, info.stdout

    (tmp_path / "release").touch()
    for connection, answer in streams:
        assert answer.read() == b"second\n"
        connection.close()
    (kept,) = _until("back to 1 replica", lambda: _serving(up, "auto", 1), deadline_s=120)
    found = _info(up, "auto")
    assert found["replicas"] == 1
    out = [r for r in found["routes"] if r["id"] != kept["id"] and r["status"] == "terminated"]
    assert len(out) >= 2
    for route in out:
        session = json.loads(
            up.corral("session", "info", str(route["session_id"]), "--json").stdout
        )
        assert session["status"] in ("TERMINATED", "CANCELLED")
    assert {r["id"] for r in routes} >= {kept["id"]}
    history = _history(up, "auto")
    assert any(h["phase"] == "AutoscaleDeployment" for h in history["deployment"])


def _history(up: Up, name: str) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{up.said_after('corral is up at ')}/v1/deployments/{urllib.parse.quote(name)}/history",
        headers={"Authorization": f"Bearer {up.said_after('admin token: ')}"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        found: dict[str, Any] = json.loads(answer.read())
    return found
