"""Frames over a socket pair (`agent_pipe.FramedConnection`): whole, in order, however the
stream cuts them."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from corral.bench.agent_pipe import FramedConnection

Frame = tuple[dict[str, Any], bytes]


@dataclass
class Pair:
    """A sending end and a receiving end, and what the receiving end got."""

    sender: FramedConnection
    received: list[Frame] = field(default_factory=list)


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    found = Pair(FramedConnection(lambda header, body: None))
    receiver = FramedConnection(lambda header, body: found.received.append((header, body)))
    ours, theirs = socket.socketpair()
    loop = asyncio.get_running_loop()
    await loop.create_unix_connection(lambda: found.sender, sock=ours)
    await loop.create_unix_connection(lambda: receiver, sock=theirs)
    yield found
    found.sender.close()
    receiver.close()
    await asyncio.wait_for(asyncio.gather(found.sender.closed, receiver.closed), 10)


async def until(received: list[Frame], count: int) -> None:
    deadline = asyncio.get_running_loop().time() + 10
    while len(received) < count:
        assert asyncio.get_running_loop().time() < deadline, f"{len(received)} of {count}"
        await asyncio.sleep(0.01)


async def test_many_frames_in_one_turn_arrive_whole_and_in_order(pair: Pair) -> None:
    frames = [({"id": i, "call": "report"}, bytes([i % 256]) * i) for i in range(500)]
    for header, body in frames:
        pair.sender.send(header, body)
    await until(pair.received, 500)
    assert pair.received == frames


async def test_a_frame_larger_than_a_read_is_put_back_together(pair: Pair) -> None:
    """Several megabytes arrive over many reads; the frame after it is not lost."""
    big = bytes(range(256)) * 16_384  # 4 MiB
    pair.sender.send({"id": 1}, big)
    pair.sender.send({"id": 2})
    await until(pair.received, 2)
    assert pair.received == [({"id": 1}, big), ({"id": 2}, b"")]


def frame(header: bytes, body: bytes = b"") -> bytes:
    """A frame as the module's docstring lays it out: two big-endian lengths, header, body."""
    return struct.pack(">II", len(header), len(body)) + header + body


async def test_cut_anywhere_the_stream_gives_the_same_frames() -> None:
    """Fed byte by byte or in odd slices, the parser yields exactly the frames sent."""
    stream = frame(b'{"id":1,"call":"heartbeat"}') + frame(b'{"id":2}', b"\x00\x01" * 10)
    for size in (1, 3, 7, len(stream)):
        got: list[Frame] = []
        reader = FramedConnection(lambda header, body, got=got: got.append((header, body)))
        for start in range(0, len(stream), size):
            reader.data_received(stream[start : start + size])
        assert got == [({"id": 1, "call": "heartbeat"}, b""), ({"id": 2}, b"\x00\x01" * 10)]
