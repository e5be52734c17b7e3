"""The load generator's HTTP: what it needs of a client, and a lean one over raw connections.

`corral bench api` must measure the manager, not its client. httpx spends about 4 ms of CPU
per request under 32 concurrent requests (measured: 217 requests/s against a FastAPI endpoint
that returns a constant, with the client's process at 100 % of a core and the server's at
20 %), so a load generator built on it cannot send the 1,000 creates/s the target asks for.
`KeepAliveClient` writes HTTP/1.1 requests on a few kept-alive connections and reads the
answers with asyncio streams (`infra.keepalive_http`, the agent's transport too): 0.14 ms of
CPU per request, 2,230 requests/s against the same endpoint, where the server became the limit.

`Http` is the one method the load generator calls; `HttpxClient` adapts an httpx client to it
(the tests drive the load generator in-process through httpx's ASGI transport).
"""

from __future__ import annotations

from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from corral.infra.keepalive_http import HttpError, Reply, httpx_reply
from corral.infra.keepalive_http import KeepAliveClient as LeanClient

__all__ = ["Http", "HttpError", "HttpxClient", "KeepAliveClient", "Reply"]


class Http(Protocol):
    """Sends one request and reads its whole answer; `HttpError` when there is none."""

    async def request(self, method: str, path: str, body: Any = None) -> Reply: ...


class HttpxClient:
    """`Http` over an httpx client (its base URL and headers apply)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def request(self, method: str, path: str, body: Any = None) -> Reply:
        try:
            response = await self.client.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise HttpError(f"{type(exc).__name__}: {exc}") from exc
        return httpx_reply(response)


class KeepAliveClient:
    """`Http` over `infra.keepalive_http.KeepAliveClient` to a plain-http server, with the
    bench's token on every request."""

    def __init__(self, base_url: str, *, token: str, timeout_s: float) -> None:
        if urlsplit(base_url).scheme != "http":
            raise ValueError(f"base_url must be http://host:port, got {base_url!r}")
        self._client = LeanClient(
            base_url,
            timeout_s=timeout_s,
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
        )

    async def request(self, method: str, path: str, body: Any = None) -> Reply:
        return await self._client.json(method, path, body)

    async def close(self) -> None:
        await self._client.close()
