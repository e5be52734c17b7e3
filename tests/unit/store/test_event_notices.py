"""Notices of appended events: runs of ids and kinds, each text within a NOTIFY payload."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.store.events import NOTIFY_LIMIT_BYTES, EventNotice, event_notices


def ids_of(texts: list[str]) -> list[int]:
    """Every id the notices name, in order."""
    notices = [EventNotice.from_data(json.loads(text)) for text in texts]
    return [i for notice in notices for first, last in notice.runs for i in range(first, last + 1)]


def test_consecutive_ids_make_one_run() -> None:
    [text] = event_notices([5, 6, 7, 9, 10, 14], {"b.kind", "a.kind"})
    notice = EventNotice.from_data(json.loads(text))
    assert notice.runs == ((5, 7), (9, 10), (14, 14))
    assert notice.kinds == {"a.kind", "b.kind"}
    assert (notice.last_id, notice.count) == (14, 6)


def test_no_ids_no_notice() -> None:
    assert event_notices([], {"a.kind"}) == []


def test_many_runs_are_split_across_notices_within_the_limit() -> None:
    ids = list(range(10**12, 10**12 + 4_000, 2))  # 2,000 runs of one id, 15 digits each
    texts = event_notices(ids, {"session.status_changed"})
    assert len(texts) > 1
    assert all(len(text.encode()) <= NOTIFY_LIMIT_BYTES for text in texts)
    assert ids_of(texts) == ids
    assert all(
        EventNotice.from_data(json.loads(t)).kinds == {"session.status_changed"} for t in texts
    )


def test_too_many_kinds_are_sent_as_any_kind() -> None:
    kinds = {f"kind.number_{n:04d}" for n in range(200)}
    [text] = event_notices([1], kinds)
    assert EventNotice.from_data(json.loads(text)).kinds is None


@pytest.mark.parametrize(
    "data",
    [{"ids": []}, {"ids": [[3, 2]]}, {"ids": [["x", 1]]}, {"ids": [[1]]}, {"kinds": ["a"]}],
)
def test_malformed_notices_are_refused(data: dict[str, object]) -> None:
    with pytest.raises((ValueError, KeyError, TypeError)):
        EventNotice.from_data(data)


@given(st.lists(st.integers(1, 10**15), min_size=1, max_size=3_000, unique=True))
def test_every_id_is_named_once_in_order(raw: list[int]) -> None:
    ids = sorted(raw)
    texts = event_notices(ids, {"k"})
    assert ids_of(texts) == ids
    assert all(len(text.encode()) <= NOTIFY_LIMIT_BYTES for text in texts)
