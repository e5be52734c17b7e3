"""The agent protocol over a socket pair: `corral simulate`'s agents in a process of their own.

The simulated agents are real agent daemons. They used to share the manager's process and event
loop, so a run measured the manager plus a thousand agents on one core (16 to 20 % of its
samples went to the agents). Over this pipe they run in a second process, as agents on other
nodes would. The manager answers them through the same calls as the in-process transport
(`manager/inprocess.py`: the controller, its validation, HTTP's statuses), and validates each
message's JSON on arrival as the HTTP routes do.

A frame is two big-endian lengths, a JSON header and a body. The agents' end sends requests
(`{"id", "call", "agent", ...}`, the protocol message as the body) and events (`{"event"}`); the
manager's end answers (`{"id", "status"}`: 200 with the message, or the status an HTTP route
would give with the problem) and sends controls (`{"control"}`). The frames written in one turn
of the event loop leave as one write: a small socket write costs tens of microseconds here.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import struct
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from corral.agent.client import ManagerRejectedError, ManagerUnavailableError
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
from corral.controller.agents import AgentController
from corral.manager.inprocess import InProcessManagerClient

Header = dict[str, Any]
OnFrame = Callable[[Header, bytes], None]

_LENGTHS = struct.Struct(">II")
OK = 200
UNAVAILABLE = 503


class FramedConnection(asyncio.Protocol):
    """Frames in and out of a stream; `closed` resolves when the stream ends."""

    def __init__(self, on_frame: OnFrame) -> None:
        self._on_frame = on_frame
        self._buffer = bytearray()
        self._pending: list[bytes] = []
        self._transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        start = 0
        while len(buffer) - start >= _LENGTHS.size:
            header_size, body_size = _LENGTHS.unpack_from(buffer, start)
            body_start = start + _LENGTHS.size + header_size
            end = body_start + body_size
            if end > len(buffer):
                break
            header = json.loads(buffer[start + _LENGTHS.size : body_start])
            body = bytes(buffer[body_start:end])
            start = end
            self._on_frame(header, body)
        del buffer[:start]

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if not self.closed.done():
            self.closed.set_result(None)

    @property
    def is_open(self) -> bool:
        """Whether frames can still be sent."""
        return self._transport is not None and not self._transport.is_closing()

    def send(self, header: Header, body: bytes = b"") -> None:
        """Queue a frame; the frames queued in this turn of the loop are written together."""
        encoded = json.dumps(header, separators=(",", ":")).encode()
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending += (_LENGTHS.pack(len(encoded), len(body)), encoded, body)

    def close(self) -> None:
        """Write what is queued, then close."""
        self._flush()
        if self._transport is not None:
            self._transport.close()

    def _flush(self) -> None:
        if self._pending and self.is_open:
            assert self._transport is not None
            self._transport.write(b"".join(self._pending))
        self._pending.clear()


class AgentPipeServer:
    """The manager's end: each request answered through the controller, as over HTTP."""

    def __init__(self, controller: AgentController, on_event: Callable[[Header], None]) -> None:
        self._client = InProcessManagerClient(controller)
        self._on_event = on_event
        self._answering: set[asyncio.Task[None]] = set()
        self.connection = FramedConnection(self._received)

    @property
    def answering(self) -> int:
        """Requests in progress (long polls in wait among them)."""
        return len(self._answering)

    def send_control(self, control: str) -> None:
        """Tell the agents' end something (`stop`)."""
        self.connection.send({"control": control})

    async def close(self) -> None:
        """Stop answering (long polls in wait are cancelled) and close the pipe."""
        for task in self._answering:
            task.cancel()
        await asyncio.gather(*self._answering, return_exceptions=True)
        self.connection.close()

    def _received(self, header: Header, body: bytes) -> None:
        if "event" in header:
            self._on_event(header)
            return
        task = asyncio.create_task(self._answer(header, body))
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)

    async def _answer(self, header: Header, body: bytes) -> None:
        answer: Header = {"id": header["id"], "status": OK}
        try:
            message = await self._call(header, body)
        except ManagerRejectedError as exc:
            answer["status"] = exc.status
            reply = json.dumps(exc.problem).encode()
        except ManagerUnavailableError as exc:
            answer["status"] = UNAVAILABLE
            reply = json.dumps({"detail": str(exc)}).encode()
        except ValidationError as exc:
            answer["status"] = 422
            reply = json.dumps(
                {
                    "detail": f"invalid {exc.title}",
                    "errors": json.loads(exc.json(include_url=False)),
                }
            ).encode()
        else:
            if isinstance(message, bytes):
                reply = message
            else:
                reply = message.model_dump_json().encode() if message is not None else b""
        self.connection.send(answer, reply)

    async def _call(self, header: Header, body: bytes) -> BaseModel | bytes | None:
        client, agent_id = self._client, header.get("agent", "")
        match header.get("call"):
            case "register":
                request = RegisterRequest.model_validate_json(body)
                return await client.register(request, header.get("token", ""))
            case "heartbeat":
                return await client.heartbeat(agent_id)
            case "assignment":
                return await client.assignment(agent_id, header.get("since"), header["wait_s"])
            case "report":
                return await client.report(agent_id, ReportBatch.model_validate_json(body).reports)
            case "upload_logs":
                await client.upload_logs(agent_id, LogBatch.model_validate_json(body).chunks)
            case "upload_outputs":
                await client.upload_outputs(agent_id, OutputBatch.model_validate_json(body).outputs)
            case "fetch_upload":  # the archive's bytes, as the HTTP route answers them
                return await client.fetch_upload(agent_id, uuid.UUID(header["kernel"]))
            case other:
                raise ManagerRejectedError(404, {"detail": f"no such call: {other!r}"})
        return None


class PipeManagerClient:
    """The agents' end: a ManagerClient for any number of agents over one pipe."""

    def __init__(self, on_control: Callable[[str], None]) -> None:
        self._on_control = on_control
        self._ids = itertools.count()
        self._calls: dict[int, asyncio.Future[tuple[int, bytes]]] = {}
        self.connection = FramedConnection(self._received)
        self.connection.closed.add_done_callback(self._fail_calls)

    def send_event(self, event: str, **fields: Any) -> None:
        """Tell the manager's end something (`registered`, `done`)."""
        self.connection.send({"event": event, **fields})

    async def register(self, request: RegisterRequest, token: str) -> RegisterResponse:
        """Join or come back, with the token in the request's header."""
        body = await self._request(
            {"call": "register", "agent": request.agent_id, "token": token},
            request.model_dump_json().encode(),
        )
        return RegisterResponse.model_validate_json(body)

    async def heartbeat(self, agent_id: str) -> HeartbeatResponse:
        """I am alive."""
        body = await self._request({"call": "heartbeat", "agent": agent_id})
        return HeartbeatResponse.model_validate_json(body)

    async def assignment(
        self, agent_id: str, since: int | None, wait_s: float
    ) -> AssignmentMessage:
        """The assignment, long-polling when `since` is given."""
        body = await self._request(
            {"call": "assignment", "agent": agent_id, "since": since, "wait_s": wait_s}
        )
        return AssignmentMessage.model_validate_json(body)

    async def report(self, agent_id: str, reports: list[KernelReportMessage]) -> ReportAccepted:
        """A report batch; the answer names the refused reports' kernels."""
        body = ReportBatch(reports=reports).model_dump_json().encode()
        reply = await self._request({"call": "report", "agent": agent_id}, body)
        return ReportAccepted.model_validate_json(reply)

    async def upload_logs(self, agent_id: str, chunks: list[LogChunkMessage]) -> None:
        """Log chunks."""
        body = LogBatch(chunks=chunks).model_dump_json().encode()
        await self._request({"call": "upload_logs", "agent": agent_id}, body)

    async def upload_outputs(self, agent_id: str, outputs: list[OutputMessage]) -> None:
        """Output files."""
        body = OutputBatch(outputs=outputs).model_dump_json().encode()
        await self._request({"call": "upload_outputs", "agent": agent_id}, body)

    async def fetch_upload(self, agent_id: str, kernel_id: uuid.UUID) -> bytes:
        """The kernel's upload (the raw tar.gz), as the HTTP route answers it."""
        return await self._request(
            {"call": "fetch_upload", "agent": agent_id, "kernel": str(kernel_id)}
        )

    async def close(self) -> None:
        """Nothing per agent: the pipe is shared, and its owner closes it."""

    async def _request(self, header: Header, body: bytes = b"") -> bytes:
        if not self.connection.is_open:
            raise ManagerUnavailableError(f"{header['call']}: the manager's pipe is closed")
        call_id = next(self._ids)
        future: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        self.connection.send({"id": call_id, **header}, body)
        try:
            status, reply = await future
        finally:
            self._calls.pop(call_id, None)
        if status == OK:
            return reply
        problem = json.loads(reply)
        if status >= 500:
            raise ManagerUnavailableError(f"{header['call']}: {problem.get('detail')}")
        raise ManagerRejectedError(status, problem)

    def _received(self, header: Header, body: bytes) -> None:
        if "control" in header:
            self._on_control(header["control"])
            return
        future = self._calls.get(header["id"])
        if future is not None and not future.done():
            future.set_result((header["status"], body))

    def _fail_calls(self, _closed: asyncio.Future[None]) -> None:
        for future in self._calls.values():
            if not future.done():
                future.set_exception(ManagerUnavailableError("the manager's pipe closed"))


__all__ = ["AgentPipeServer", "FramedConnection", "PipeManagerClient"]
