"""How often `corral simulate` counts the ended sessions (bench.simulate._poll_interval_s)."""

from __future__ import annotations

from corral.bench.simulate import NEAR_END_MIN, POLL_NEAR_END_S, POLL_S, _poll_interval_s


def test_far_from_the_end_it_counts_seldom() -> None:
    assert _poll_interval_s(15_000, 20_000) == POLL_S


def test_near_the_end_it_counts_often_so_the_run_is_timed_closely() -> None:
    assert _poll_interval_s(1_000, 20_000) == POLL_NEAR_END_S  # 5 % left
    assert _poll_interval_s(NEAR_END_MIN, 1_000) == POLL_NEAR_END_S  # a small run
    assert _poll_interval_s(0, 20_000) == POLL_NEAR_END_S
    assert POLL_NEAR_END_S < POLL_S
