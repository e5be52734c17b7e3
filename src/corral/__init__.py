"""corral: a session orchestrator for AI compute clusters."""

from __future__ import annotations

# The package's version: pyproject.toml takes it from here (`[tool.setuptools.dynamic]`).
__version__ = "0.1.0"


def package_version() -> str:
    """corral's version (what its package metadata says too).

    Read from here, not from the installed metadata: finding and parsing that cost every
    command line call that sends a User-Agent 6-11 ms.
    """
    return __version__
