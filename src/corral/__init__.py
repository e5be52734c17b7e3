"""corral: a session orchestrator for AI compute clusters."""

from __future__ import annotations

from functools import cache


@cache
def package_version() -> str:
    """corral's version, as its package metadata (from pyproject.toml) says."""
    # Imported here: reading package metadata costs milliseconds that most commands never need.
    from importlib.metadata import version

    return version("corral")
