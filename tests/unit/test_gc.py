"""The collector settings a long-lived corral process runs with."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from corral._gc import THRESHOLDS, tune_gc


@pytest.fixture
def restored_gc() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_tune_gc_freezes_startup_objects_and_collects_less_often(restored_gc: None) -> None:
    assert gc.get_freeze_count() == 0
    tune_gc()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == THRESHOLDS
    assert THRESHOLDS[0] > 700, "young collections must be rarer than CPython's default"


def test_tune_gc_without_collecting_still_freezes(restored_gc: None) -> None:
    """The command line's start (`collect=False`): no full collection, the same freeze and
    thresholds."""
    collections_before = gc.get_stats()[2]["collections"]
    tune_gc(collect=False)
    assert gc.get_stats()[2]["collections"] == collections_before
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == THRESHOLDS
