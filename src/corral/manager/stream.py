"""The agent protocol over one local byte stream, many agents' calls multiplexed on it.

`corral simulate` runs its simulated agents in a second process, so that the manager it
measures has a core to itself, as it would with real agents on their own machines. HTTP per
call would cost the manager more than the agents save it; here every agent of that process
shares one Unix socket. A frame is a 4-byte big-endian length and a JSON array:

- a call, agent → manager: `[id, op, agent_id, body]` (id ≥ 1, op one of `OPS`);
- its answer, manager → agent: `[id, status, body]`, status 200 with the answer's body, or the
  HTTP status the route would have given with a problem-details body;
- a control message either way: `[0, kind, body]` (the fleet's `ready`, `stop`, `summary`).

The manager's side answers through `InProcessManagerClient`, so the same controller, the same
validation and the same errors as the HTTP routes and the in-process transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import TypeAdapter, ValidationError

from corral.agent.client import ManagerRejectedError, ManagerUnavailableError
from corral.agent.protocol import (
    AssignmentMessage,
    HeartbeatResponse,
    KernelReportMessage,
    LogChunkMessage,
    OutputMessage,
    RegisterRequest,
    RegisterResponse,
)
from corral.controller.agents import AgentController
from corral.manager.inprocess import InProcessManagerClient

logger = logging.getLogger(__name__)

CONTROL = 0  # the id of a control message
MAX_FRAME = 64 << 20
OPS = ("register", "heartbeat", "assignment", "report", "upload_logs", "upload_outputs")

_REPORTS = TypeAdapter(list[KernelReportMessage])
_CHUNKS = TypeAdapter(list[LogChunkMessage])
_OUTPUTS = TypeAdapter(list[OutputMessage])

ControlHandler = Callable[[str, Any], None]


class StreamClosedError(ConnectionError):
    """The other end closed the stream (or sent something that is not a frame)."""


def write_frame(writer: asyncio.StreamWriter, message: list[Any]) -> None:
    """Queue one frame (the transport sends it at once or buffers it)."""
    data = json.dumps(message, separators=(",", ":")).encode()
    writer.write(len(data).to_bytes(4, "big") + data)


async def read_frame(reader: asyncio.StreamReader) -> list[Any] | None:
    """The next frame; None at the end of the stream."""
    try:
        size = int.from_bytes(await reader.readexactly(4), "big")
        if size > MAX_FRAME:
            raise StreamClosedError(f"a frame of {size} bytes (at most {MAX_FRAME})")
        message = json.loads(await reader.readexactly(size))
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise StreamClosedError("the stream ended inside a frame") from exc
        return None
    if not isinstance(message, list) or not message or not isinstance(message[0], int):
        raise StreamClosedError("a frame is not an [id, ...] array")
    return message


class AgentChannel:
    """The agents' end of the stream: calls with ids, answers matched, control messages out."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        on_control: ControlHandler,
    ) -> None:
        self._writer = writer
        self._on_control = on_control
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[tuple[int, Any]]] = {}
        self.closed = asyncio.Event()
        self._reading = asyncio.create_task(self._read(reader), name="agent-channel")

    async def call(self, op: str, agent_id: str, body: Any) -> Any:
        """Send a call and wait for its answer's body; raise as the HTTP client would."""
        if self.closed.is_set():
            raise ManagerUnavailableError("the manager's stream is closed")
        call_id = next(self._ids)
        answer = self._waiting[call_id] = asyncio.get_running_loop().create_future()
        try:
            write_frame(self._writer, [call_id, op, agent_id, body])
            status, body = await answer
        finally:
            self._waiting.pop(call_id, None)
        if status == 200:
            return body
        problem = body if isinstance(body, dict) else {"detail": str(body)}
        if status >= 500:
            raise ManagerUnavailableError(f"HTTP {status}: {problem.get('detail')}")
        raise ManagerRejectedError(status, problem)

    def control(self, kind: str, body: Any) -> None:
        """Send a control message."""
        write_frame(self._writer, [CONTROL, kind, body])

    async def close(self) -> None:
        """Flush what is queued and close the stream."""
        with contextlib.suppress(ConnectionError):
            await self._writer.drain()
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()
        self._reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reading

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while (message := await read_frame(reader)) is not None:
                if message[0] == CONTROL:
                    self._on_control(message[1], message[2])
                    continue
                answer = self._waiting.get(message[0])
                if answer is not None and not answer.done():
                    answer.set_result((message[1], message[2]))
        except (StreamClosedError, ConnectionError) as exc:
            logger.error("agent_channel.broken", extra={"error": str(exc)})
        finally:
            self.closed.set()
            for answer in self._waiting.values():
                if not answer.done():
                    answer.set_exception(ManagerUnavailableError("the manager's stream closed"))


class StreamManagerClient:
    """A ManagerClient for one agent, over a channel its process's agents share."""

    def __init__(self, channel: AgentChannel) -> None:
        self._channel = channel

    async def register(self, request: RegisterRequest, token: str) -> RegisterResponse:
        """Join or come back (see ManagerClient)."""
        body = {"request": request.model_dump(mode="json"), "token": token}
        answer = await self._channel.call("register", request.agent_id, body)
        return RegisterResponse.model_validate(answer)

    async def heartbeat(self, agent_id: str) -> HeartbeatResponse:
        """I am alive."""
        return HeartbeatResponse.model_validate(
            await self._channel.call("heartbeat", agent_id, None)
        )

    async def assignment(
        self, agent_id: str, since: int | None, wait_s: float
    ) -> AssignmentMessage:
        """The desired state, long-polled."""
        body = {"since": since, "wait_s": wait_s}
        return AssignmentMessage.model_validate(
            await self._channel.call("assignment", agent_id, body)
        )

    async def report(self, agent_id: str, reports: list[KernelReportMessage]) -> None:
        """Kernel progress, in order (all or none)."""
        await self._channel.call("report", agent_id, _REPORTS.dump_python(reports, mode="json"))

    async def upload_logs(self, agent_id: str, chunks: list[LogChunkMessage]) -> None:
        """Log chunks."""
        await self._channel.call("upload_logs", agent_id, _CHUNKS.dump_python(chunks, mode="json"))

    async def upload_outputs(self, agent_id: str, outputs: list[OutputMessage]) -> None:
        """Output files."""
        body = _OUTPUTS.dump_python(outputs, mode="json")
        await self._channel.call("upload_outputs", agent_id, body)

    async def close(self) -> None:
        """The channel is the process's, closed by its owner."""


async def serve_agents(
    controller: AgentController,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    on_control: ControlHandler,
) -> None:
    """Answer the calls coming in on one stream until it ends (each call in its own task)."""
    client = InProcessManagerClient(controller)
    calls: set[asyncio.Task[None]] = set()
    try:
        while (message := await read_frame(reader)) is not None:
            if message[0] == CONTROL:
                on_control(message[1], message[2])
                continue
            call = asyncio.create_task(_answer(client, writer, message))
            calls.add(call)
            call.add_done_callback(calls.discard)
    finally:
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)


async def _answer(
    client: InProcessManagerClient, writer: asyncio.StreamWriter, message: list[Any]
) -> None:
    call_id = message[0]
    try:
        _, op, agent_id, body = message
        status, answer = 200, await _dispatch(client, op, agent_id, body)
    except ManagerRejectedError as exc:
        status, answer = exc.status, exc.problem
    except ManagerUnavailableError as exc:
        status, answer = 503, {"detail": str(exc)}
    except (ValueError, ValidationError, TypeError, KeyError) as exc:
        status, answer = 422, {"detail": f"malformed {message[1:2]} call: {exc}"}
    except Exception as exc:  # an HTTP route would answer 500; the agent tries again
        logger.exception("agent_stream.call_failed", extra={"op": message[1:2]})
        status, answer = 500, {"detail": type(exc).__name__}
    if not writer.is_closing():
        write_frame(writer, [call_id, status, answer])
        with contextlib.suppress(ConnectionError):
            await writer.drain()


def _dispatch(client: InProcessManagerClient, op: str, agent_id: str, body: Any) -> Awaitable[Any]:
    match op:
        case "register":
            request = RegisterRequest.model_validate(body["request"])
            return _dumped(client.register(request, str(body["token"])))
        case "heartbeat":
            return _dumped(client.heartbeat(agent_id))
        case "assignment":
            return _dumped(client.assignment(agent_id, body["since"], float(body["wait_s"])))
        case "report":
            return client.report(agent_id, _REPORTS.validate_python(body))
        case "upload_logs":
            return client.upload_logs(agent_id, _CHUNKS.validate_python(body))
        case "upload_outputs":
            return client.upload_outputs(agent_id, _OUTPUTS.validate_python(body))
    raise ValueError(f"unknown op {op!r} (one of {', '.join(OPS)})")


async def _dumped(answer: Awaitable[Any]) -> Any:
    return (await answer).model_dump(mode="json")


__all__ = [
    "AgentChannel",
    "StreamClosedError",
    "StreamManagerClient",
    "read_frame",
    "serve_agents",
    "write_frame",
]
