"""What `python` means for user jobs: the host's python3, never corral's own virtualenv.

corral may run from a virtualenv of its own (pipx, `make`): its packages are corral's, not the
user's, so a kernel must not start inside it unless asked. The default is the first `python3`
on the agent's PATH outside that virtualenv, else the interpreter the virtualenv was made from.
A `python3` that is a script (pyenv's shim) is asked once, at the agent's start, for the
interpreter it runs, so a kernel start costs no shell and no pyenv lookup.
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
_SHIM_TIMEOUT_S = 10.0


def corral_venv() -> Path | None:
    """The virtualenv corral itself runs from, or None when it runs from no virtualenv."""
    if sys.prefix == sys.base_prefix:
        return None
    return Path(sys.prefix).resolve()


@functools.lru_cache(maxsize=16)
def outside_corral_venv(path: str) -> str:
    """A PATH value without the folders of corral's own virtualenv (memoised: every kernel
    start asks, with the agent's one PATH, and resolving its folders costs a syscall each)."""
    venv = corral_venv()
    if venv is None:
        return path
    return os.pathsep.join(f for f in path.split(os.pathsep) if f and not _inside(f, venv))


def host_python(path: str | None = None) -> Path:
    """The first `python3` on `path` (default: PATH) outside corral's venv, else its base."""
    searched = outside_corral_venv(path if path is not None else os.environ.get("PATH", ""))
    for folder in searched.split(os.pathsep):
        candidate = Path(folder or ".", "python3")
        if folder and candidate.is_file() and os.access(candidate, os.X_OK):
            return _through_shim(candidate)
    # A venv records the interpreter it was made from; outside one this is sys.executable.
    return Path(getattr(sys, "_base_executable", sys.executable))


def _inside(folder: str, venv: Path) -> bool:
    try:
        return Path(folder).resolve().is_relative_to(venv)
    except OSError:
        return False


def _through_shim(candidate: Path) -> Path:
    """`candidate`, or the interpreter it runs when it is a script (a version manager's shim)."""
    try:
        with candidate.open("rb") as file:
            if file.read(2) != b"#!":
                return candidate
        answer = subprocess.run(
            [str(candidate), "-c", "import sys; print(sys.executable)"],
            capture_output=True,
            text=True,
            timeout=_SHIM_TIMEOUT_S,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        extra = {"python": str(candidate), "error": str(exc)}
        logger.warning("runtime.python_shim_unresolved", extra=extra)
        return candidate
    resolved = Path(answer.stdout.strip())
    return resolved if resolved.is_absolute() and resolved.is_file() else candidate
