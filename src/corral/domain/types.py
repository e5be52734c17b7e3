"""Identifier types shared by every layer."""

from __future__ import annotations

import uuid
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
