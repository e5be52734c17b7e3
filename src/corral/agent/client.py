"""How an agent talks to its manager: one interface, over HTTP or in-process.

`HttpManagerClient` is what `corral agent` uses; `corral simulate` runs thousands of agents in
a process of their own over a socket pair (`bench/agent_pipe.py`), answered by the same
controller the HTTP routes call (`manager/inprocess.py`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx

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
        timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, CONNECT_TIMEOUT_S))
        verify = verifying_context(ca_file)
        limits = httpx.Limits(  # httpx's default counts
            max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEPALIVE_S
        )
        self._http = [
            httpx.AsyncClient(
                base_url=e.url,
                timeout=timeout,
                limits=limits,
                headers={"Host": e.host} if e.host is not None else None,
                verify=verify,
            )
            for e in endpoints
        ]
        # An address of a name: TLS names (SNI) and verifies the name, not the address.
        self._extensions = [
            {"sni_hostname": e.host} if e.host is not None else None for e in endpoints
        ]
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
        """Close the connection pools."""
        for http in self._http:
            await http.aclose()

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
        for index in self._order():
            try:
                response = await self._http[index].request(
                    method,
                    path,
                    json=json,
                    params=params,
                    headers={"Authorization": f"Bearer {bearer}"},
                    timeout=timeout_s if timeout_s is not None else self._timeout_s,
                    extensions=self._extensions[index],
                )
            except httpx.HTTPError as exc:
                endpoint = self.endpoints[index]
                untrusted = untrusted_certificate(exc)
                failures.append(
                    f"{endpoint}: {type(exc).__name__}: {exc}"
                    if untrusted is None
                    else f"{endpoint}: {untrusted_hint(endpoint.url, untrusted)}"
                )
                self._failed(index)
                continue
            if response.status_code >= 500:
                failures.append(f"{self.endpoints[index]}: HTTP {response.status_code}")
                self._failed(index)
                continue
            self._answered(index)
            return self._result(response, raw)
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
    def _result(response: httpx.Response, raw: bool = False) -> Any:
        """The answer's JSON (None when empty), its bytes if `raw`; a 4xx raises."""
        if response.status_code >= 400:
            try:
                problem = response.json()
            except ValueError:
                problem = {"detail": response.text[:500]}
            raise ManagerRejectedError(response.status_code, problem)
        if raw:
            return response.content
        if response.status_code == 204 or not response.content:
            return None
        return response.json()
