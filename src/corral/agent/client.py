"""How an agent talks to its manager: one interface, over HTTP or in-process.

`HttpManagerClient` is what `corral agent` uses; `corral simulate` runs thousands of agents in
a process of their own over a socket pair (`bench/agent_pipe.py`), answered by the same
controller the HTTP routes call (`manager/inprocess.py`).

Its requests go over `infra.keepalive_http` (kept-alive HTTP/1.1 connections it writes and reads
itself): httpx had cost an agent 1 to 3 ms of CPU a request, most of an idle agent's CPU (a
heartbeat every ten seconds). That client sends a request again on a new connection when a
kept-alive one turns out closed before any of the answer came: every call here may be repeated
(a report the manager has is acknowledged as `already`, log chunks are kept by offset; a
registration with the join token is a process's first call, on a new connection). Where
the environment names a proxy (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY), they go over httpx, which
honours it and NO_PROXY.
"""

from __future__ import annotations

import json
import logging
import ssl
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode

from corral._proxies import proxy_configured
from corral._tls import untrusted_certificate, untrusted_hint, verifying_context
from corral.agent.endpoints import Endpoint
from corral.agent.protocol import (
    AssignmentMessage,
    HeartbeatResponse,
    KernelReportMessage,
    LogBatch,
    LogChunkMessage,
    OutputBatch,
    OutputMessage,
    RegisterRequest,
    RegisterResponse,
    ReportAccepted,
    ReportBatch,
)
from corral.infra.keepalive_http import HttpError, KeepAliveClient, Reply, httpx_reply

logger = logging.getLogger(__name__)

# How long after the first manager failed the agent tries it again (when on another one).
FAILBACK_AFTER_S = 30.0
# Connecting to a manager: beyond this it counts as unreachable and the next one is tried.
CONNECT_TIMEOUT_S = 3.0
# An idle connection to a manager is kept this long (httpx's default, 5 s, is shorter than the
# pause between heartbeats, 10 s by default: each made a new connection, a TLS handshake with
# it); the manager keeps it 5 s longer than the heartbeat interval (`manager.daemon`).
KEEPALIVE_S = 12.0


class ManagerUnavailableError(ConnectionError):
    """The manager could not be reached or failed (5xx): try again later."""


class ManagerRejectedError(RuntimeError):
    """The manager refused the request (4xx); `problem` is its problem-details body."""

    def __init__(self, status: int, problem: dict[str, Any]) -> None:
        self.status = status
        self.problem = problem
        super().__init__(f"HTTP {status}: {problem.get('detail') or problem.get('title')}")


class ManagerClient(Protocol):
    """The agent protocol, as the agent calls it."""

    async def register(self, request: RegisterRequest, token: str) -> RegisterResponse:
        """Join (join token) or come back (own token); later calls use the agent's token."""
        ...

    async def heartbeat(self, agent_id: str) -> HeartbeatResponse:
        """I am alive."""
        ...

    async def assignment(
        self, agent_id: str, since: int | None, wait_s: float
    ) -> AssignmentMessage:
        """The full desired state; with `since`, once it differs from that revision."""
        ...

    async def report(self, agent_id: str, reports: list[KernelReportMessage]) -> ReportAccepted:
        """Kernel progress, in order; the answer names the refused reports' kernels."""
        ...

    async def upload_logs(self, agent_id: str, chunks: list[LogChunkMessage]) -> None:
        """Log chunks (idempotent by offset)."""
        ...

    async def upload_outputs(self, agent_id: str, outputs: list[OutputMessage]) -> None:
        """Output files."""
        ...

    async def fetch_upload(self, agent_id: str, kernel_id: uuid.UUID) -> bytes:
        """The tar.gz a kernel of the agent unpacks before it starts (404: it names none)."""
        ...

    async def close(self) -> None:
        """Release connections."""
        ...


class HttpManagerClient:
    """The agent protocol over HTTP with bearer tokens, to one manager of several.

    Calls go to the current manager; on a connection error or a 5xx the same call goes to the
    next one at once (each at most once per call; then ManagerUnavailableError, and the caller
    backs off). While on another than the first, the first is tried again with the next call
    once `failback_after_s` passed since it last failed: the agent returns to it once it is back.
    An https manager's certificate is verified against `ca_file`, else the system's store; for
    an endpoint reached by one address of its name, against that name.
    """

    def __init__(
        self,
        managers: str | Sequence[str | Endpoint],
        *,
        timeout_s: float = 10.0,
        failback_after_s: float = FAILBACK_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
        ca_file: str | Path | None = None,
    ) -> None:
        if isinstance(managers, str):
            managers = [managers]
        endpoints = [m if isinstance(m, Endpoint) else Endpoint(m.rstrip("/")) for m in managers]
        if not endpoints:
            raise ValueError("an agent needs at least one manager URL")
        self._timeout_s = timeout_s
        self._failback_after_s = failback_after_s
        self._clock = clock
        self.endpoints = tuple(endpoints)
        # Connecting to a manager that is gone should fail fast, so the next one is tried.
        verify = verifying_context(ca_file)
        transport = _HttpxTransport if proxy_configured() else _lean
        self._http: list[_Transport] = [transport(e, verify, timeout_s) for e in endpoints]
        self.current = 0  # index of the manager calls go to first
        self._first_failed_at: float | None = None  # clock() when the first manager last failed
        self._token: str | None = None

    async def register(self, request: RegisterRequest, token: str) -> RegisterResponse:
        """Register; remembers the agent token (the new one, or the one presented)."""
        body = await self._call(
            "POST",
            "/v1/agents/register",
            json=request.model_dump(mode="json"),
            token=token,
        )
        response = RegisterResponse.model_validate(body)
        self._token = response.token or token
        return response

    async def heartbeat(self, agent_id: str) -> HeartbeatResponse:
        """POST a heartbeat."""
        body = await self._call("POST", f"/v1/agents/{agent_id}/heartbeat")
        return HeartbeatResponse.model_validate(body)

    async def assignment(
        self, agent_id: str, since: int | None, wait_s: float
    ) -> AssignmentMessage:
        """GET the assignment, long-polling when `since` is given."""
        params: dict[str, Any] = {"wait": wait_s}
        if since is not None:
            params["since"] = since
        body = await self._call(
            "GET",
            f"/v1/agents/{agent_id}/assignments",
            params=params,
            timeout_s=wait_s + self._timeout_s,
        )
        return AssignmentMessage.model_validate(body)

    async def report(self, agent_id: str, reports: list[KernelReportMessage]) -> ReportAccepted:
        """POST a report batch."""
        body = await self._call(
            "POST",
            f"/v1/agents/{agent_id}/reports",
            json=ReportBatch(reports=reports).model_dump(mode="json"),
        )
        return ReportAccepted.model_validate(body)

    async def upload_logs(self, agent_id: str, chunks: list[LogChunkMessage]) -> None:
        """POST log chunks."""
        await self._call(
            "POST",
            f"/v1/agents/{agent_id}/logs",
            json=LogBatch(chunks=chunks).model_dump(mode="json"),
        )

    async def upload_outputs(self, agent_id: str, outputs: list[OutputMessage]) -> None:
        """POST output files."""
        await self._call(
            "POST",
            f"/v1/agents/{agent_id}/outputs",
            json=OutputBatch(outputs=outputs).model_dump(mode="json"),
        )

    async def fetch_upload(self, agent_id: str, kernel_id: uuid.UUID) -> bytes:
        """GET the kernel's upload."""
        data = await self._call(
            "GET", f"/v1/agents/{agent_id}/kernels/{kernel_id}/upload", raw=True
        )
        assert isinstance(data, bytes)
        return data

    async def close(self) -> None:
        """Close the connections."""
        for http in self._http:
            await http.close()

    def _order(self) -> list[int]:
        """The managers to try for a call, in order: the current one first, except that the
        first is tried first again once `failback_after_s` passed since it failed."""
        count = len(self._http)
        order = [(self.current + i) % count for i in range(count)]
        failed_at = self._first_failed_at
        if self.current != 0 and (
            failed_at is None or self._clock() - failed_at >= self._failback_after_s
        ):
            order.remove(0)
            order.insert(0, 0)
        return order

    async def _call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        token: str | None = None,
        timeout_s: float | None = None,
        raw: bool = False,
    ) -> Any:
        bearer = token or self._token
        if bearer is None:
            raise RuntimeError("register first: no agent token yet")
        failures: list[str] = []
        body = None if json is None else _json_bytes(json)
        query = urlencode(params) if params else ""
        headers = {"Authorization": f"Bearer {bearer}"}
        for index in self._order():
            try:
                reply = await self._http[index].request(
                    method,
                    path,
                    body=body,
                    query=query,
                    headers=headers,
                    timeout_s=timeout_s if timeout_s is not None else self._timeout_s,
                )
            except HttpError as exc:
                endpoint = self.endpoints[index]
                untrusted = untrusted_certificate(exc)
                failures.append(
                    f"{endpoint}: {exc}"
                    if untrusted is None
                    else f"{endpoint}: {untrusted_hint(endpoint.url, untrusted)}"
                )
                self._failed(index)
                continue
            if reply.status >= 500:
                failures.append(f"{self.endpoints[index]}: HTTP {reply.status}")
                self._failed(index)
                continue
            self._answered(index)
            return self._result(reply, raw)
        raise ManagerUnavailableError(f"{method} {path}: " + "; ".join(failures))

    def _failed(self, index: int) -> None:
        if index == 0:
            self._first_failed_at = self._clock()

    def _answered(self, index: int) -> None:
        if index != self.current:
            logger.info(
                "agent.manager_switched",
                extra={
                    "manager": str(self.endpoints[index]),
                    "previous": str(self.endpoints[self.current]),
                },
            )
            self.current = index

    @staticmethod
    def _result(reply: Reply, raw: bool = False) -> Any:
        """The answer's JSON (None when empty), its bytes if `raw`; a 4xx raises."""
        if reply.status >= 400:
            try:
                problem = reply.json()
            except ValueError:
                problem = {"detail": reply.text[:500]}
            if not isinstance(problem, dict):
                problem = {"detail": str(problem)[:500]}
            raise ManagerRejectedError(reply.status, problem)
        if raw:
            return reply.body
        if reply.status == 204 or not reply.body:
            return None
        return reply.json()


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class _Transport(Protocol):
    """Sends one request to one manager and reads the whole answer; HttpError when none
    (`KeepAliveClient`, or httpx where a proxy is named)."""

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None,
        query: str,
        headers: Mapping[str, str],
        timeout_s: float,
    ) -> Reply: ...

    async def close(self) -> None: ...


def _lean(endpoint: Endpoint, verify: ssl.SSLContext, timeout_s: float) -> KeepAliveClient:
    """Kept-alive connections of our own to `endpoint` (`infra.keepalive_http`)."""
    return KeepAliveClient(
        endpoint.url,
        timeout_s=timeout_s,
        connect_timeout_s=min(timeout_s, CONNECT_TIMEOUT_S),
        ssl_context=verify,
        # An address of a name: the Host header, TLS's name (SNI) and its check, the name.
        server_hostname=endpoint.host,
        keepalive_s=KEEPALIVE_S,
    )


class _HttpxTransport:
    """httpx, for an environment that names a proxy."""

    def __init__(self, endpoint: Endpoint, verify: ssl.SSLContext, timeout_s: float) -> None:
        import httpx

        self._httpx = httpx
        self._client = httpx.AsyncClient(
            base_url=endpoint.url,
            timeout=httpx.Timeout(timeout_s, connect=min(timeout_s, CONNECT_TIMEOUT_S)),
            limits=httpx.Limits(  # httpx's default counts
                max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEPALIVE_S
            ),
            headers={"Host": endpoint.host} if endpoint.host is not None else None,
            verify=verify,
        )
        # An address of a name: TLS names (SNI) and verifies the name, not the address.
        self._extensions = {"sni_hostname": endpoint.host} if endpoint.host is not None else None

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None,
        query: str,
        headers: Mapping[str, str],
        timeout_s: float,
    ) -> Reply:
        extra = {"Content-Type": "application/json"} if body is not None else {}
        try:
            response = await self._client.request(
                method,
                f"{path}?{query}" if query else path,
                content=body,
                headers={**headers, **extra},
                timeout=timeout_s,
                extensions=self._extensions,
            )
        except self._httpx.HTTPError as exc:
            raise HttpError(f"{type(exc).__name__}: {exc}") from exc
        return httpx_reply(response)

    async def close(self) -> None:
        await self._client.aclose()
