"""`PlainCall` over real sockets: the command line's quick requests go over `http.client` to a
real HTTP server, or through the proxy the environment names (then over httpx)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from corral import package_version
from corral.client._http import PlainCall
from corral.client.errors import NotFoundError, ServerError, UnreachableError

# A request as the server saw it: method, target, headers (lower-cased names), body.
Seen = tuple[str, str, dict[str, str], bytes]
# What the server answers: status, content type, body.
Reply = tuple[int, str, bytes]


class _Server:
    """An HTTP server on a free port of 127.0.0.1 that records requests and answers `reply`."""

    def __init__(self, reply: Callable[[Seen], Reply]) -> None:
        self.seen: list[Seen] = []
        self.release = threading.Event()  # set: a held answer may go
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                seen = (
                    self.command,
                    self.path,
                    {k.lower(): v for k, v in self.headers.items()},
                    self.rfile.read(length),
                )
                server.seen.append(seen)
                status, kind, body = reply(seen)
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _any

            def log_message(self, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        self._thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.release.set()
        self.http.shutdown()
        self.http.server_close()


Serve = Callable[[Callable[[Seen], Reply]], _Server]


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Serve]:
    """Start servers (none sees a proxy setting from the environment); all closed after."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    started: list[_Server] = []

    def start(reply: Callable[[Seen], Reply]) -> _Server:
        started.append(_Server(reply))
        return started[-1]

    yield start
    for server in started:
        server.close()


def _json(status: int, body: object, kind: str = "application/json") -> Reply:
    return status, kind, json.dumps(body).encode()


def test_a_plain_call_sends_its_json_and_query_and_reads_the_answer(serve: Serve) -> None:
    """The body as JSON, the query as the API reads it (None left out, a list repeated, true
    for True), the token and corral's User-Agent; the answer's JSON back."""
    server = serve(lambda seen: _json(201, {"id": "s-1", "number": 7}))
    call = PlainCall(server.url, "crl_secret")

    answer = call.json(
        "POST", "/v1/sessions", {"command": ["true"]}, params={"x": [1, 2], "y": None, "z": True}
    )

    assert answer == {"id": "s-1", "number": 7}
    [(method, target, headers, body)] = server.seen
    assert (method, target) == ("POST", "/v1/sessions?x=1&x=2&z=true")
    assert headers["authorization"] == "Bearer crl_secret"
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"] == f"corral/{package_version()}"
    assert json.loads(body) == {"command": ["true"]}


def test_an_error_answer_is_the_error_it_names(serve: Serve) -> None:
    """Problem details become their error class with the API's detail; a page that is not
    problem details (a proxy's) is quoted with the request and its status."""
    problem = {"type": "https://corral.dev/problems/session-not-found", "title": "No such"}
    server = serve(
        lambda seen: (
            _json(404, {**problem, "detail": "no session 9"}, "application/problem+json")
            if seen[1].startswith("/v1/sessions/9")
            else (503, "text/html", b"<h1>down for maintenance</h1>")
        )
    )
    call = PlainCall(server.url, "crl_secret")
    with pytest.raises(NotFoundError) as missing:
        call.json("GET", "/v1/sessions/9")
    assert (str(missing.value), missing.value.kind) == ("no session 9", "session-not-found")
    with pytest.raises(ServerError) as down:
        call.json("GET", "/v1/me")
    assert str(down.value) == (
        f"GET {server.url}/v1/me answered 503 Service Unavailable: <h1>down for maintenance</h1>"
    )


def test_a_server_that_does_not_answer_in_time_is_unreachable(serve: Serve) -> None:
    """No answer within the call's timeout: unreachable, saying how long it waited."""
    server = serve(lambda seen: (server.release.wait(10), _json(200, {}))[1])
    call = PlainCall(server.url, "crl_secret", timeout_s=0.2)
    with pytest.raises(UnreachableError) as late:
        call.json("GET", "/v1/me")
    assert str(late.value) == f"{server.url} did not answer within 0.2 s (TimeoutError)"


def test_nothing_listening_says_what_to_check(serve: Serve) -> None:
    """Nothing listens at the URL: unreachable, naming it and what to check."""
    server = serve(lambda seen: _json(200, {}))
    url = server.url
    server.close()
    with pytest.raises(UnreachableError) as refused:
        PlainCall(url, "crl_secret").json("GET", "/v1/me")
    assert str(refused.value).startswith(f"cannot reach corral at {url}: ")
    assert str(refused.value).endswith(
        "is the manager running (`corral up`), and is the URL right?"
    )


def test_with_a_proxy_configured_the_call_goes_through_it(
    serve: Serve,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HTTP_PROXY set: the request goes to the proxy, naming the manager (a host only the proxy
    could reach), as the SDK's would."""
    proxy = serve(lambda seen: _json(200, {"name": "alice"}))
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    answer = PlainCall("http://manager.invalid:8470", "crl_secret").json("GET", "/v1/me")
    assert answer == {"name": "alice"}
    [(method, target, headers, _)] = proxy.seen
    assert (method, target) == ("GET", "http://manager.invalid:8470/v1/me")
    assert headers["authorization"] == "Bearer crl_secret"
