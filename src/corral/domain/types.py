"""Identifier types shared by every layer, and the clock type."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import NewType

SessionId = NewType("SessionId", uuid.UUID)
KernelId = NewType("KernelId", uuid.UUID)
AgentId = NewType("AgentId", str)
DeploymentId = NewType("DeploymentId", uuid.UUID)
RouteId = NewType("RouteId", uuid.UUID)
UserId = NewType("UserId", uuid.UUID)

ADMIN_ROLE = "admin"  # a user who sees and acts on every session; every other role: "user"
USER_ROLE = "user"
# A user's name: 1 to 64 letters, digits, '.', '_', '-', starting with a letter or digit.
USER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_MILLIS_MASK = (1 << 48) - 1  # a UUID v7's time: milliseconds since 1970, 48 bits
_RANDOM_MASK = (1 << 62) - 1  # and its random tail


def time_ordered_uuid(now_ns: int | None = None) -> uuid.UUID:
    """A fresh UUID version 7 (RFC 9562): the Unix time in milliseconds, then 12 bits of the
    millisecond's fraction, then 62 random bits (`now_ns`: the time, default the clock's).

    Ids made later sort later, as integers, as bytes and as text, so the index entries of
    rows keyed by them (a session's kernels, history and events) are written next to those of
    sessions made about the same time, which a batch mostly moves together: a random id (v4)
    puts each entry on a page of its own, and every one of those pages is written to the
    database's log at commit. Ids made within one 244 ns step keep a random order.
    """
    if now_ns is None:
        now_ns = time.time_ns()
    millis, rest_ns = divmod(now_ns, 1_000_000)
    fraction = rest_ns * 4096 // 1_000_000
    random_bits = int.from_bytes(os.urandom(8), "big") & _RANDOM_MASK
    return uuid.UUID(
        int=(millis & _MILLIS_MASK) << 80 | 0x7 << 76 | fraction << 64 | 0b10 << 62 | random_bits
    )


def new_session_id() -> SessionId:
    """A fresh session id, ordered by creation time (`time_ordered_uuid`)."""
    return SessionId(time_ordered_uuid())


def new_kernel_id() -> KernelId:
    """A fresh kernel id, ordered by creation time (`time_ordered_uuid`)."""
    return KernelId(time_ordered_uuid())


Clock = Callable[[], datetime]  # injected wherever "now" matters, so tests can move time


def utcnow() -> datetime:
    """The real clock: now, timezone-aware UTC (the default `Clock`)."""
    return datetime.now(UTC)
