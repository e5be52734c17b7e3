"""Kernels' output as shown: raw bytes, prefixed lines, held-back partial lines, the note."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from corral.domain.log_text import (
    LineFormatter,
    LogPiece,
    dropped_note,
    merge_by_time,
    size_text,
)
from corral.domain.moments import parse_moment

T0 = datetime(2030, 1, 1, tzinfo=UTC)
T1 = T0 + timedelta(seconds=1)


def test_one_kernel_without_timestamps_passes_bytes_through() -> None:
    """No prefix to add: the bytes as written, a partial line included, nothing held back."""
    formatter = LineFormatter()
    out = formatter.feed([LogPiece(0, T0, b"a\nb"), LogPiece(3, T1, b"c")])
    assert b"".join(line.text for line in out) == b"a\nbc"
    assert formatter.finish() == []


def test_a_line_split_across_pieces_is_one_line_with_its_first_pieces_time() -> None:
    """A line is prefixed once, with the time of the piece it started in; the last one ended."""
    formatter = LineFormatter(label="kernel 1", timestamps=True)
    out = formatter.feed([LogPiece(0, T0, b"one\ntw"), LogPiece(6, T1, b"o\nthr")])
    out += formatter.finish()
    assert [line.text for line in out] == [
        b"2030-01-01T00:00:00.000Z [kernel 1] one\n",
        b"2030-01-01T00:00:00.000Z [kernel 1] two\n",
        b"2030-01-01T00:00:01.000Z [kernel 1] thr\n",
    ]


def test_kernels_merge_by_time_each_in_its_own_order() -> None:
    """Lines of several kernels interleave by storage time."""
    zero = LineFormatter(label="kernel 0").feed([LogPiece(0, T0, b"a\n"), LogPiece(2, T1, b"c\n")])
    one = LineFormatter(label="kernel 1").feed([LogPiece(0, T0, b"b\n")])
    assert b"".join(merge_by_time([zero, one])) == (b"[kernel 0] a\n[kernel 1] b\n[kernel 0] c\n")


def test_the_dropped_note_names_the_size() -> None:
    """Sizes read as people write them, in SI units."""
    assert dropped_note(12_345_678) == b"[corral: 12.3 MB of earlier output dropped]\n"
    assert [size_text(n) for n in (512, 2_000, 3_500_000_000)] == ["512 bytes", "2.0 kB", "3.5 GB"]


def test_a_moment_is_an_age_or_an_iso_time() -> None:
    """`10m` is ten minutes ago; an ISO time without a zone is UTC; anything else is refused."""
    assert parse_moment("10m", T1) == T1 - timedelta(minutes=10)
    assert parse_moment("1.5h", T1) == T1 - timedelta(minutes=90)
    assert parse_moment("2030-01-01T00:00:00", T1) == T0
    assert parse_moment("2030-01-01T01:00:00+01:00", T1) == T0
    with pytest.raises(ValueError, match="age like 30s"):
        parse_moment("yesterday", T1)
    with pytest.raises(ValueError, match="out of the range"):
        parse_moment("0001-01-01T00:00:00+01:00", T1)
