"""Kernels' log bytes as a reader sees them: lines, prefixes, timestamps, the dropped note.

The manager formats what `corral session logs` prints (the API's logs route does the work, so
a client receives only what it shows). With one kernel and no timestamps the bytes pass
through untouched, as the kernel wrote them; otherwise every line gets its prefix (`[kernel
N] ` when a session has several kernels, the time its chunk was stored with `timestamps`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime

from corral.domain.record import record

# Where a session's output was cut by the size cap: the first line shown says how much.
DROPPED_NOTE = "[corral: {size} of earlier output dropped]\n"
_SIZE_UNITS = (("GB", 10**9), ("MB", 10**6), ("kB", 10**3))


@record
class LogPiece:
    """Bytes of one stream from `offset` on, stored (uploaded) at `stored_at`."""

    offset: int
    stored_at: datetime
    data: bytes


@record
class LogLine:
    """A unit of formatted output, in the order a merge of several kernels keeps."""

    stored_at: datetime
    text: bytes


def size_text(size: int) -> str:
    """A byte count for people, in SI units: `12.3 MB`, `512 bytes`."""
    for unit, scale in _SIZE_UNITS:
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def dropped_note(size: int) -> bytes:
    """The line that marks `size` bytes dropped by the log size cap."""
    return DROPPED_NOTE.format(size=size_text(size)).encode()


def timestamp_text(moment: datetime) -> str:
    """A chunk's storage time as a line prefix: RFC 3339 UTC to the millisecond."""
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class LineFormatter:
    """One stream's bytes into output units: passed through, or lines with their prefixes.

    Fed contiguous pieces (a follower feeds them as they come), it holds back a line without
    its newline until the newline arrives or `finish()` ends it.
    """

    def __init__(self, *, label: str | None = None, timestamps: bool = False) -> None:
        self.label = label  # e.g. "kernel 1": lines start with "[kernel 1] "
        self.timestamps = timestamps
        self._partial = bytearray()
        self._partial_at: datetime | None = None

    @property
    def raw(self) -> bool:
        """Whether bytes pass through untouched (no prefix to add)."""
        return self.label is None and not self.timestamps

    def note(self, text: bytes, at: datetime) -> LogLine:
        """A line of corral's own (the dropped note), prefixed like the kernel's lines."""
        return LogLine(at, self._prefix(at) + text)

    def feed(self, pieces: Iterable[LogPiece]) -> list[LogLine]:
        """The output units of these pieces (complete lines only, unless raw)."""
        out: list[LogLine] = []
        for piece in pieces:
            if self.raw:
                if piece.data:
                    out.append(LogLine(piece.stored_at, piece.data))
                continue
            data = piece.data
            start = 0
            while start < len(data):
                newline = data.find(b"\n", start)
                if newline < 0:
                    if not self._partial:
                        self._partial_at = piece.stored_at
                    self._partial += data[start:]
                    break
                at = self._partial_at if self._partial else piece.stored_at
                assert at is not None
                line = bytes(self._partial) + data[start : newline + 1]
                self._partial.clear()
                out.append(LogLine(at, self._prefix(at) + line))
                start = newline + 1
        return out

    def finish(self) -> list[LogLine]:
        """The held-back last line, ended with a newline (nothing if none, or raw)."""
        if not self._partial or self._partial_at is None:
            return []
        at = self._partial_at
        line = LogLine(at, self._prefix(at) + bytes(self._partial) + b"\n")
        self._partial.clear()
        return [line]

    def _prefix(self, at: datetime) -> bytes:
        parts = []
        if self.timestamps:
            parts.append(timestamp_text(at))
        if self.label is not None:
            parts.append(f"[{self.label}]")
        return (" ".join(parts) + " ").encode() if parts else b""


def merge_by_time(outputs: Iterable[list[LogLine]]) -> Iterator[bytes]:
    """Several kernels' lines interleaved by storage time, each kernel's kept in its order."""
    for line in heapq.merge(*outputs, key=lambda line: line.stored_at):
        yield line.text
