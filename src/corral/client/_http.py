"""What every client of corral's API sends and how it reads a failure, async or not.

The SDK's `Client` (async, typed models) and `PlainCall` (one synchronous request, plain JSON:
the command line's `corral run --detach`) share these, so both authenticate, verify TLS and
word an unreachable server the same way.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from corral import package_version
from corral._tls import TlsConfigError, untrusted_certificate, untrusted_hint, verifying_context
from corral.client.config import ClientConfigError, check_url
from corral.client.errors import CorralError, UnreachableError, error_from_response

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
    """A request's query: parameters left at None are not sent (the server's defaults apply);
    a sequence is sent as the parameter repeated (`status=A&status=B`)."""
    pairs: list[tuple[str, str | int | float | bool | None]] = []
    for key, value in (params or {}).items():
        values = value if isinstance(value, list | tuple) else [value]
        pairs.extend((key, _text(item)) for item in values if item is not None)
    return httpx.QueryParams(pairs)


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


def unreachable(url: str, timeout_s: float, exc: httpx.TransportError) -> UnreachableError:
    """The error for a request to `url` that got no answer."""
    if isinstance(exc, httpx.TimeoutException):
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


def answer_json(response: httpx.Response, method: str, path: str, url: str) -> Any:
    """The JSON of a successful answer; the error it stands for otherwise."""
    if response.is_error:
        raise error_from_response(response)
    try:
        return response.json()
    except ValueError as exc:
        raise CorralError(
            f"{method} {path} answered {response.status_code} without JSON; is {url} "
            "a corral manager?",
            status=response.status_code,
        ) from exc


class PlainCall:
    """One synchronous request, plain JSON in and out: no models, no event loop.

    For the command line's quickest verbs (`corral run --detach`), which start in a fraction of
    the time without pydantic and asyncio. `transport` replaces the network (tests).
    """

    def __init__(
        self,
        url: str,
        token: str,
        *,
        ca_file: str | Path | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        options = http_options(url, token, ca_file)
        self.url: str = options["base_url"]
        self.timeout_s = timeout_s
        self._options = {**options, "timeout": timeout_s, "transport": transport}

    def json(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        *,
        params: Mapping[str, object] | None = None,
    ) -> Any:
        """Send `body` as JSON; the answer's JSON, or a `CorralError` subclass."""
        with httpx.Client(**self._options) as http:
            try:
                response = http.request(method, path, json=body, params=query(params))
            except httpx.TransportError as exc:
                raise unreachable(self.url, self.timeout_s, exc) from exc
        return answer_json(response, method, path, self.url)

    def items(self, path: str, params: Mapping[str, object]) -> Iterator[Any]:
        """Every item of a listing, page by page (`next_cursor`), as the API's JSON."""
        cursor = None
        while True:
            page = self.json("GET", path, params={**params, "cursor": cursor})
            yield from page["items"]
            cursor = page.get("next_cursor")
            if cursor is None:
                return
