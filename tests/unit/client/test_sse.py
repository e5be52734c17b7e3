"""Server-Sent Events parsing: the WHATWG rules the event stream relies on."""

from __future__ import annotations

from collections.abc import AsyncIterator

from corral.client._sse import ServerSentEvent, parse_sse


async def _parse(text: str) -> list[ServerSentEvent]:
    async def lines() -> AsyncIterator[str]:
        for line in text.split("\n"):
            yield line

    return [event async for event in parse_sse(lines())]


async def test_fields_make_one_event_per_blank_line() -> None:
    """`id`, `event` and `data` build an event that a blank line dispatches."""
    events = await _parse('id: 7\nevent: session.status_changed\ndata: {"a": 1}\n\n')
    assert events == [ServerSentEvent("session.status_changed", '{"a": 1}', "7")]


async def test_data_lines_join_with_newlines_and_one_leading_space_is_dropped() -> None:
    """Several data lines are one value; only the single space after the colon is dropped."""
    events = await _parse("data:first\ndata:  second\ndata\n\n")
    assert events == [ServerSentEvent("message", "first\n second\n")]


async def test_comments_and_unknown_fields_are_ignored() -> None:
    """Keep-alive comments and unknown fields neither dispatch nor change an event."""
    events = await _parse(": connected\n\n: keep-alive\nretry: 10\nfoo: bar\ndata: x\n\n")
    assert events == [ServerSentEvent("message", "x")]


async def test_the_last_id_persists_and_the_event_type_resets() -> None:
    """An id holds for later events until replaced; the type defaults back to `message`."""
    events = await _parse("id: 1\nevent: a\ndata: x\n\ndata: y\n\nid: 2\ndata: z\n\n")
    assert [(e.event, e.data, e.id) for e in events] == [
        ("a", "x", "1"),
        ("message", "y", "1"),
        ("message", "z", "2"),
    ]


async def test_an_event_cut_off_by_the_end_of_the_stream_is_dropped() -> None:
    """Without its blank line, a last event is incomplete and not dispatched."""
    assert await _parse("data: whole\n\ndata: cut") == [ServerSentEvent("message", "whole")]


async def test_an_event_without_data_is_not_dispatched() -> None:
    """Only an event name, no data: nothing to deliver."""
    assert await _parse("event: ping\n\n") == []
