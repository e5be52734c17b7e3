"""Ports for serving replicas: one the operating system says is free on this agent."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port nothing listens on now (the OS's choice for a bind to port 0).

    Another process may take it before the replica binds it; the replica then fails to start
    and its deployment replaces it, as for any replica that does not come up.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        port: int = probe.getsockname()[1]
        return port
