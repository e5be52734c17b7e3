"""Waiting on real processes in the agent's integration tests (`eventually` is shared)."""

from __future__ import annotations

from pathlib import Path

from tests.integration._polling import eventually

__all__ = ["eventually", "process_gone"]


def process_gone(pid: int) -> bool:
    """True when `pid` no longer runs (absent, or a zombie nobody reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"
