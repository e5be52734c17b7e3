"""Server-Sent Events: lines of a `text/event-stream` body into events (the WHATWG rules)."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator

from corral.domain.record import record


@record
class ServerSentEvent:
    """One dispatched event: its type (`message` unless named), data, and the last id seen."""

    event: str
    data: str
    id: str | None = None


async def parse_sse(lines: AsyncIterable[str]) -> AsyncIterator[ServerSentEvent]:
    """The events of a stream given as lines without their line ends.

    A blank line dispatches the event being built; an event cut off by the end of the stream is
    dropped, as the standard requires. Comment lines (`:` first, used as keep-alives) are
    skipped. The id persists across events until the server sends another.
    """
    event = ""
    data: list[str] = []
    last_id: str | None = None
    async for line in lines:
        if not line:
            if data:
                yield ServerSentEvent(event or "message", "\n".join(data), last_id)
            event, data = "", []
            continue
        if line.startswith(":"):
            continue
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            event = value
        elif name == "data":
            data.append(value)
        elif name == "id" and "\0" not in value:
            last_id = value or None
        # `retry` and unknown fields are ignored: the client does not reconnect by itself.
