"""Writing a secret (a token) to a file only its owner may read."""

from __future__ import annotations

import os
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """Replace `path` with `text`, readable and writable by its owner only.

    Written to a temporary file created 0600 and renamed over `path`: the secret is never
    readable by others, not even for a moment or when `path` already existed with a wider mode,
    and a crash leaves the old file whole.
    """
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        os.fchmod(file.fileno(), 0o600)  # a leftover temporary file keeps its mode through O_TRUNC
        file.write(text)
    os.replace(temporary, path)
