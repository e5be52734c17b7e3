"""Identifier types shared by every layer, and the clock type."""

from __future__ import annotations

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


def new_session_id() -> SessionId:
    """A fresh random session id."""
    return SessionId(uuid.uuid4())


def new_kernel_id() -> KernelId:
    """A fresh random kernel id."""
    return KernelId(uuid.uuid4())


Clock = Callable[[], datetime]  # injected wherever "now" matters, so tests can move time


def utcnow() -> datetime:
    """The real clock: now, timezone-aware UTC (the default `Clock`)."""
    return datetime.now(UTC)
