"""What every client of corral's API sends and how it reads a failure, async or not.

The SDK's `Client` (async, typed models, httpx) and `PlainCall` (one synchronous request, plain
JSON, the standard library's `http.client`: the command line's `corral run --detach`) share
these, so both authenticate, verify TLS and word an unreachable server the same way. Nothing
here loads httpx unless it is used: a plain call costs the command line ~30 ms less without it.
"""

from __future__ import annotations

import http.client
import json
import ssl
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode, urlsplit

from corral import package_version
from corral._proxies import proxy_configured
from corral._tls import TlsConfigError, untrusted_certificate, untrusted_hint, verifying_context
from corral.client.config import ClientConfigError, check_url
from corral.client.errors import CorralError, UnreachableError, error_from_answer
from corral.domain.record import record

if TYPE_CHECKING:
    import httpx

DEFAULT_TIMEOUT_S = 30.0


def http_options(url: str, token: str, ca_file: str | Path | None) -> dict[str, Any]:
    """The httpx client options for `url` with `token` (base URL, headers, TLS verification).

    A plain-http URL never makes a TLS connection (requests are relative to it and no redirect
    is followed): the CA store is loaded only for https, or for a `ca_file` given.
    """
    base = check_url(url)
    verify: ssl.SSLContext | bool = False
    if ca_file is not None or not base.startswith("http://"):
        try:
            verify = verifying_context(ca_file)
        except TlsConfigError as exc:
            raise ClientConfigError(str(exc)) from exc
    return {
        "base_url": base,
        "verify": verify,
        "headers": {
            "Authorization": f"Bearer {token}",
            "User-Agent": f"corral/{package_version()}",
        },
    }


def query(params: Mapping[str, object] | None) -> httpx.QueryParams:
    """A request's query for httpx (see `query_pairs`)."""
    import httpx

    return httpx.QueryParams(tuple(query_pairs(params)))


def query_pairs(params: Mapping[str, object] | None) -> list[tuple[str, str]]:
    """A request's query: parameters left at None are not sent (the server's defaults apply);
    a sequence is sent as the parameter repeated (`status=A&status=B`)."""
    pairs: list[tuple[str, str]] = []
    for key, value in (params or {}).items():
        values = value if isinstance(value, list | tuple) else [value]
        pairs.extend((key, _text(item)) for item in values if item is not None)
    return pairs


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def session_path(ref: object) -> str:
    """The path of the session a reference names (a number, an id, a prefix, a name, 12_7)."""
    return f"/v1/sessions/{quote(str(ref), safe='')}"


def array_path(ref: object) -> str:
    """The path of the job array a reference names (its number or id)."""
    return f"/v1/arrays/{quote(str(ref).strip(), safe='')}"


def unreachable(url: str, timeout_s: float, exc: Exception) -> UnreachableError:
    """The error for a request to `url` that got no answer (`exc`: httpx's transport error, or
    the standard library's OSError or HTTPException)."""
    if _timed_out(exc):
        return UnreachableError(
            f"{url} did not answer within {timeout_s:g} s ({type(exc).__name__})"
        )
    reason = untrusted_certificate(exc)
    if reason is not None:
        return UnreachableError(untrusted_hint(url, reason))
    return UnreachableError(
        f"cannot reach corral at {url}: {exc or type(exc).__name__}; is the "
        "manager running (`corral up`), and is the URL right?"
    )


def _timed_out(exc: Exception) -> bool:
    if isinstance(exc, TimeoutError):
        return True
    httpx = sys.modules.get("httpx")  # an httpx error comes only where httpx is loaded
    return httpx is not None and isinstance(exc, httpx.TimeoutException)


def answer_json(response: httpx.Response, method: str, path: str, url: str) -> Any:
    """The JSON of a successful answer; the error it stands for otherwise."""
    where = f"{response.request.method} {response.request.url}"
    answer = Answer(response.status_code, response.reason_phrase, response.content)
    return answer.json(method, path, url, where)


@record
class Answer:
    """An HTTP answer as a plain call reads it: status, reason phrase, body."""

    status: int
    reason: str
    content: bytes

    def json(self, method: str, path: str, url: str, where: str) -> Any:
        """The JSON of a successful answer; the error it stands for otherwise (`where` names
        the request: "GET https://...")."""
        if self.status >= 400:
            raise error_from_answer(self.status, self.reason, self.content, where)
        try:
            return json.loads(self.content)
        except ValueError as exc:
            raise CorralError(
                f"{method} {path} answered {self.status} without JSON; is {url} a corral manager?",
                status=self.status,
            ) from exc


# How a plain call reaches the server: (method, absolute URL, headers, body, timeout) → the
# answer, or UnreachableError. `PlainCall` picks `http.client`'s, or httpx's where a proxy is
# configured; tests give their own.
Send = Callable[[str, str, Mapping[str, str], bytes | None, float], Answer]


class PlainCall:
    """One synchronous request, plain JSON in and out: no models, no event loop, no httpx.

    For the command line's quickest verbs (`corral run --detach`, `corral session ls`), which
    start in a fraction of the time without pydantic, asyncio and httpx. The request goes over
    `http.client`; where the environment names a proxy (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY),
    over httpx, which honours it (and NO_PROXY) as the SDK does. `send` replaces the network
    (tests).
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        ca_file: str | Path | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        send: Send | None = None,
    ) -> None:
        options = http_options(url, token, ca_file)
        self.url: str = options["base_url"]
        self.timeout_s = timeout_s
        self._headers: dict[str, str] = options["headers"]
        verify: ssl.SSLContext | bool = options["verify"]
        if send is None:
            proxied = proxy_configured()
            send = _httpx_sender(self.url, verify) if proxied else _sender(self.url, verify)
        self._send = send

    def json(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        params: Mapping[str, object] | None = None,
    ) -> Any:
        """Send `body` as JSON; the answer's JSON, or a `CorralError` subclass."""
        pairs = query_pairs(params)
        target = self.url + path + (f"?{urlencode(pairs)}" if pairs else "")
        headers = dict(self._headers)
        content = None
        if body is not None:
            content = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        answer = self._send(method, target, headers, content, self.timeout_s)
        return answer.json(method, path, self.url, f"{method} {target}")

    def items(self, path: str, params: Mapping[str, object]) -> Iterator[Any]:
        """Every item of a listing, page by page (`next_cursor`), as the API's JSON."""
        cursor = None
        while True:
            page = self.json("GET", path, params={**params, "cursor": cursor})
            yield from page["items"]
            cursor = page.get("next_cursor")
            if cursor is None:
                return


def _sender(base: str, verify: ssl.SSLContext | bool) -> Send:
    """`Send` over `http.client`, one connection per request, to the server at `base`."""
    split = urlsplit(base)
    context = verify if isinstance(verify, ssl.SSLContext) else None

    def send(
        method: str, url: str, headers: Mapping[str, str], body: bytes | None, timeout_s: float
    ) -> Answer:
        target = urlsplit(url)
        path = target.path + (f"?{target.query}" if target.query else "")
        connection: http.client.HTTPConnection
        if split.scheme == "https":
            connection = http.client.HTTPSConnection(
                split.hostname or "", split.port, timeout=timeout_s, context=context
            )
        else:
            connection = http.client.HTTPConnection(
                split.hostname or "", split.port, timeout=timeout_s
            )
        try:
            connection.request(method, path, body=body, headers=dict(headers))
            response = connection.getresponse()
            return Answer(response.status, response.reason, response.read())
        except (OSError, http.client.HTTPException) as exc:
            raise unreachable(base, timeout_s, exc) from exc
        finally:
            connection.close()

    return send


def _httpx_sender(base: str, verify: ssl.SSLContext | bool) -> Send:
    """`Send` over httpx, which honours the environment's proxy settings."""
    import httpx

    def send(
        method: str, url: str, headers: Mapping[str, str], body: bytes | None, timeout_s: float
    ) -> Answer:
        with httpx.Client(verify=verify, timeout=timeout_s) as client:
            try:
                response = client.request(method, url, content=body, headers=headers)
            except httpx.TransportError as exc:
                raise unreachable(base, timeout_s, exc) from exc
        return Answer(response.status_code, response.reason_phrase, response.content)

    return send
