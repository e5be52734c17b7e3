"""Written time limits: the short forms and Slurm's, bounds, and how durations are shown."""

from __future__ import annotations

import pytest

from corral.domain.time_limit import MAX_TIME_LIMIT_S, format_duration, parse_time_limit


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("90m", 5400),
        ("2h", 7200),
        ("1d", 86400),
        ("2H", 7200),
        ("10", 600),  # Slurm: MM
        ("1:30", 90),  # MM:SS
        ("01:02:03", 3723),  # HH:MM:SS
        ("2-3", 2 * 86400 + 3 * 3600),  # D-HH
        ("2-03:04", 2 * 86400 + 3 * 3600 + 4 * 60),  # D-HH:MM
        ("1-00:00:05", 86405),  # D-HH:MM:SS
    ],
)
def test_every_form_gives_its_seconds(text: str, seconds: int) -> None:
    """The short forms and each of Slurm's `--time` forms."""
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["", "2x", "1:2:3:4", "h", "-1", "1.5h", "2 hours"])
def test_other_text_says_which_forms_are_accepted(text: str) -> None:
    """Anything else is refused with the forms to use."""
    with pytest.raises(ValueError, match="like 2h, 90m"):
        parse_time_limit(text)


def test_limits_are_bounded() -> None:
    """Zero and more than the maximum are refused."""
    with pytest.raises(ValueError, match="between 1 second"):
        parse_time_limit("0")
    assert parse_time_limit(f"{MAX_TIME_LIMIT_S}s") == MAX_TIME_LIMIT_S
    with pytest.raises(ValueError, match="between 1 second"):
        parse_time_limit(f"{MAX_TIME_LIMIT_S + 1}s")


def test_durations_read_as_people_write_them() -> None:
    """The two largest units; never negative."""
    assert [format_duration(s) for s in (7200, 5400, 45, 3 * 86400 + 4 * 3600 + 5, -3)] == [
        "2h",
        "1h 30m",
        "45s",
        "3d 4h",
        "0s",
    ]
