"""What the route handlers read of a route's replica session."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.domain.status import SESSION_TERMINAL, SessionStatus


def session_ended(route: Mapping[str, Any]) -> bool:
    """Whether the route's replica session has ended."""
    status = route.get("session_status")
    return status is not None and SessionStatus(status) in SESSION_TERMINAL


def replica_address(route: Mapping[str, Any]) -> tuple[str, int] | None:
    """Where the running replica listens, as its agent reported (None: not known yet)."""
    if route.get("session_status") != SessionStatus.RUNNING.value:
        return None
    info = route.get("runtime_info") or {}
    host, port = info.get("host"), info.get("port")
    if not isinstance(host, str) or not host or not isinstance(port, int):
        return None
    return host, port
