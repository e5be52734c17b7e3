"""When a table has outgrown the planner's statistics (store.planner_stats.outgrown)."""

from __future__ import annotations

from corral.store.planner_stats import GROWTH_FACTOR, MIN_PAGES, outgrown


def test_a_never_analyzed_table_is_outgrown_from_min_pages_on() -> None:
    assert not outgrown(0, MIN_PAGES - 1)
    assert outgrown(0, MIN_PAGES)


def test_an_analyzed_table_is_outgrown_once_it_grew_by_the_factor() -> None:
    counted = 1_000
    assert not outgrown(counted, int(counted * GROWTH_FACTOR) - 1)
    assert outgrown(counted, int(counted * GROWTH_FACTOR))


def test_a_table_that_shrank_is_not_outgrown() -> None:
    assert not outgrown(5_000, 100)
