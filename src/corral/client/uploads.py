"""Packing a directory for `corral run --upload`: a deterministic tar.gz and its sha256.

The same tree always gives the same bytes (entries sorted, times, owners and the gzip header
fixed), so its digest names it and a second submit of an unchanged tree sends nothing. Left
out: every `.git` folder, and what `.corralignore` at the top of the tree lists, one glob a
line, like a simple `.gitignore`:

- blank lines and lines starting with `#` are skipped; `!` (re-include) is not supported;
- a pattern without `/` matches a file or folder name at any depth (`*.ckpt`, `__pycache__`);
- a pattern with `/` matches the path from the top (`data/raw`, `/build`; a leading `/` only
  anchors), and a folder left out leaves out all it holds;
- a trailing `/` matches folders only (`logs/`).

Symbolic links are packed as links; the agent's extraction refuses those leading outside.
"""

from __future__ import annotations

import fnmatch
import gzip
import hashlib
import os
import stat
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

IGNORE_FILE = ".corralignore"
ALWAYS_LEFT_OUT = (".git",)
_SPOOL_BYTES = 8 * 1024 * 1024  # archives up to this size stay in memory


class UploadError(ValueError):
    """A directory that cannot be packed (missing, not a directory, unreadable)."""


@dataclass(frozen=True)
class Ignore:
    """The patterns of a `.corralignore` (see the module docstring)."""

    patterns: tuple[tuple[str, bool], ...]  # (glob, folders only)

    @classmethod
    def parse(cls, text: str) -> Ignore:
        """The patterns of a `.corralignore` file's text."""
        patterns = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", "!")):
                continue
            folders_only = line.endswith("/")
            patterns.append((line.rstrip("/"), folders_only))
        return cls(tuple(patterns))

    def ignores(self, path: str, is_dir: bool) -> bool:
        """Whether `path` (relative, '/'-separated) is left out."""
        name = path.rsplit("/", 1)[-1]
        for pattern, folders_only in self.patterns:
            if folders_only and not is_dir:
                continue
            if "/" in pattern:
                if fnmatch.fnmatchcase(path, pattern.lstrip("/")):
                    return True
            elif fnmatch.fnmatchcase(name, pattern):
                return True
        return False


@dataclass
class PackedDirectory:
    """A packed directory: its archive (a file, read from the start), digest and counts."""

    archive: IO[bytes]
    digest: str  # sha256 of the archive, lowercase hex
    size_bytes: int
    files: int

    def close(self) -> None:
        """Release the archive's memory or temporary file."""
        self.archive.close()


def pack_directory(root: Path) -> PackedDirectory:
    """The tar.gz of `root` without `.git` and what `.corralignore` lists, with its digest."""
    if not root.is_dir():
        raise UploadError(f"{root} is not a directory; give --upload the folder to send")
    ignore_file = root / IGNORE_FILE
    ignore = Ignore.parse(ignore_file.read_text()) if ignore_file.is_file() else Ignore(())
    archive: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES)  # noqa: SIM115
    files = 0
    try:
        # mtime=0 and no file name: the gzip header does not vary between packs of one tree.
        with (
            gzip.GzipFile(fileobj=archive, mode="wb", mtime=0, filename="") as compressed,
            tarfile.open(fileobj=compressed, mode="w", format=tarfile.PAX_FORMAT) as tar,
        ):
            for path, relative in _entries(root, ignore):
                info = tar.gettarinfo(str(path), arcname=relative)
                info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
                if info.isreg():
                    files += 1
                    with path.open("rb") as file:
                        tar.addfile(info, file)
                elif info.isdir() or info.issym():
                    tar.addfile(info)
    except OSError as exc:
        archive.close()
        raise UploadError(f"cannot pack {root}: {exc}") from exc
    size = archive.tell()
    archive.seek(0)
    digest = hashlib.sha256()
    for block in iter(lambda: archive.read(1 << 20), b""):
        digest.update(block)
    archive.seek(0)
    return PackedDirectory(archive, digest.hexdigest(), size, files)


def _entries(root: Path, ignore: Ignore) -> Iterator[tuple[Path, str]]:
    """Every path under `root` to pack, sorted, with its '/'-separated relative name."""
    for folder, dirs, names in os.walk(root):
        base = Path(folder)
        prefix = base.relative_to(root).as_posix()
        prefix = "" if prefix == "." else f"{prefix}/"
        kept = []
        for name in sorted(dirs):
            # os.walk lists links to folders among dirs: they are packed as links, not entered.
            is_link = (base / name).is_symlink()
            if name in ALWAYS_LEFT_OUT or ignore.ignores(prefix + name, not is_link):
                continue
            if is_link:
                names.append(name)
            else:
                kept.append(name)
        dirs[:] = kept  # sorted and pruned: os.walk descends in this order, skips the rest
        for name in sorted(names):
            path = base / name
            mode = path.lstat().st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)) or name in ALWAYS_LEFT_OUT:
                continue  # sockets, fifos and devices have no place in an upload
            if ignore.ignores(prefix + name, False):
                continue
            yield path, prefix + name
        for name in kept:
            yield base / name, prefix + name
