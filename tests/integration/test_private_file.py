"""write_private: secrets land in files only their owner can read."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from corral._private_file import write_private


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_file_is_private(tmp_path: Path) -> None:
    """A file that did not exist is created 0600 with the text."""
    path = tmp_path / "token"
    write_private(path, "secret\n")
    assert (path.read_text(), _mode(path)) == ("secret\n", 0o600)


def test_an_existing_readable_file_is_replaced_by_a_private_one(tmp_path: Path) -> None:
    """A world-readable file in the way (and a leftover temporary file) never keep the secret
    readable: the result is 0600, and no temporary file is left behind."""
    path = tmp_path / "token"
    path.write_text("old\n")
    path.chmod(0o644)
    leftover = tmp_path / f".token.{os.getpid()}.tmp"
    leftover.write_text("stale")
    leftover.chmod(0o644)

    write_private(path, "new\n")

    assert (path.read_text(), _mode(path)) == ("new\n", 0o600)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["token"]
