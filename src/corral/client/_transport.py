"""The SDK's transport: `Client`'s requests, streams and network errors, one implementation
that the call mixins (`ClusterCalls`, `DeploymentCalls`) and `Client` itself inherit."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import httpx

from corral.client._http import answer_json, query, unreachable
from corral.client.errors import UnreachableError, error_from_response


class TransportCalls:
    """Requests over `_http` to `url` (`Client` sets the three attributes)."""

    url: str
    timeout_s: float
    _http: httpx.AsyncClient

    async def _json(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, object] | None = None,
        json: object = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        response = await self._send(
            method, path, params=params, json=json, content=content, headers=headers
        )
        return answer_json(response, method, path, self.url)

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, object] | None = None,
        json: object = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        with self._network_errors():
            response = await self._http.request(
                method, path, params=query(params), json=json, content=content, headers=headers
            )
        if response.is_error:
            raise error_from_response(response)
        return response

    @contextlib.asynccontextmanager
    async def _stream(
        self,
        method: str,
        path: str,
        params: Mapping[str, object],
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[httpx.Response]:
        # A followed stream may stay quiet for as long as the session does: no read timeout.
        timeout = httpx.Timeout(self.timeout_s, read=None)
        answered = False
        try:
            async with self._http.stream(
                method, path, params=query(params), headers=headers, timeout=timeout
            ) as response:
                answered = True
                if response.is_error:
                    await response.aread()
                    raise error_from_response(response)
                yield response
        except httpx.TransportError as exc:
            if not answered:
                raise self._unreachable(exc) from exc
            raise UnreachableError(
                f"lost the connection to corral at {self.url} in the middle of the stream: "
                f"{exc or type(exc).__name__}"
            ) from exc

    @contextlib.contextmanager
    def _network_errors(self) -> Iterator[None]:
        try:
            yield
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from exc

    def _unreachable(self, exc: httpx.TransportError) -> UnreachableError:
        return unreachable(self.url, self.timeout_s, exc)
