"""Sequencers: priority first, then FIFO, LIFO or dominant resource fairness within a priority."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.domain.resource_group import Sequencer
from corral.domain.session import PendingSession
from corral.domain.types import UserId
from corral.scheduler.sequencers import (
    dominant_share,
    newest_first,
    oldest_first,
    order_sessions,
    usable_capacity,
)
from corral.scheduler.types import OwnerUsage
from tests.unit.scheduler._builders import CPU, GIB, pool, session, usage, user

# Owner a is 1, owner b is 2; a session's name is its label in the expected order.
A, B, C = 1, 2, 3


def _order(
    sessions: Sequence[PendingSession],
    sequencer: Sequencer,
    *,
    held: Mapping[int, OwnerUsage] | None = None,
    capacity: Mapping[str, int] | None = None,
) -> list[str | None]:
    ordered = order_sessions(
        sessions,
        sequencer,
        usage={user(owner): u for owner, u in (held or {}).items()},
        group_capacity=capacity if capacity is not None else {"cpu": 10 * CPU},
    )
    return [s.name for s in ordered]


# --- FIFO and LIFO ---------------------------------------------------------------------------

AGE_CASES = [
    pytest.param(
        [session(name="new", created=10), session(name="old", created=0)],
        ["old", "new"],
        ["new", "old"],
        id="by-created-at",
    ),
    pytest.param(
        [
            session(name="mid", created=5),
            session(name="tie-2", id=2, created=7),
            session(name="tie-1", id=1, created=7),
            session(name="first", created=1),
        ],
        ["first", "mid", "tie-1", "tie-2"],
        ["tie-1", "tie-2", "mid", "first"],
        id="ties-by-id-ascending",
    ),
    pytest.param(
        [
            session(name="old-low", created=0, priority=0),
            session(name="new-high", created=9, priority=5),
            session(name="old-high", created=1, priority=5),
            session(name="negative", created=-5, priority=-1),
        ],
        ["old-high", "new-high", "old-low", "negative"],
        ["new-high", "old-high", "old-low", "negative"],
        id="priority-first",
    ),
    pytest.param([], [], [], id="empty"),
]


@pytest.mark.parametrize(("sessions", "fifo", "lifo"), AGE_CASES)
def test_fifo_and_lifo_order_by_age_within_each_priority(
    sessions: list[PendingSession], fifo: list[str], lifo: list[str]
) -> None:
    """FIFO is oldest first, LIFO newest first, both after priority, ties by session id."""
    assert _order(sessions, Sequencer.FIFO) == fifo
    assert _order(sessions, Sequencer.LIFO) == lifo


def test_fifo_and_lifo_ignore_owners_and_usage() -> None:
    """Only DRF looks at owners: FIFO and LIFO keep one owner's sessions together if oldest."""
    sessions = [
        session(name="a1", owner=A, created=0),
        session(name="a2", owner=A, created=1),
        session(name="b1", owner=B, created=2),
    ]
    held = {A: usage(9, {"cpu": 9 * CPU})}
    assert _order(sessions, Sequencer.FIFO, held=held) == ["a1", "a2", "b1"]
    assert _order(sessions, Sequencer.LIFO, held=held) == ["b1", "a2", "a1"]


def test_oldest_and_newest_first_are_exposed_for_reuse() -> None:
    """The per-priority sorts are usable alone and never reorder by priority."""
    low, high = session(name="low", created=0), session(name="high", created=1, priority=9)
    assert [s.name for s in oldest_first([high, low])] == ["low", "high"]
    assert [s.name for s in newest_first([low, high])] == ["high", "low"]


# --- DRF -------------------------------------------------------------------------------------

DRF_CASES = [
    pytest.param(
        [session(name=f"a{i}", owner=A, created=i) for i in (1, 2, 3)]
        + [session(name=f"b{i}", owner=B, created=10 + i) for i in (1, 2, 3)],
        {A: usage(1, {"cpu": 5 * CPU}), B: usage(1, {"cpu": 3 * CPU})},
        {"cpu": 10 * CPU},
        # b: .3 -> .4 -> .5; tie at .5 goes to a (fewer sessions held); then alternate by share
        # and, at equal shares, by sessions held.
        ["b1", "b2", "a1", "b3", "a2", "a3"],
        id="owner-holding-less-goes-first",
    ),
    pytest.param(
        [
            session(name="a1", owner=A, created=0, slots={"cpu": 4 * CPU}),
            session(name="a2", owner=A, created=1, slots={"cpu": 4 * CPU}),
        ]
        + [session(name=f"b{i}", owner=B, created=1 + i) for i in (1, 2, 3, 4)],
        {},
        {"cpu": 10 * CPU},
        # a1 is oldest; then b's four small sessions (shares .1 .. .4) all come before a2.
        ["a1", "b1", "b2", "b3", "b4", "a2"],
        id="large-session-vs-many-small",
    ),
    pytest.param(
        [session(name="a1", owner=A, created=0), session(name="b1", owner=B, created=1)],
        {A: usage(1, {"cpu": CPU, "mem": 60 * GIB}), B: usage(1, {"cpu": 5 * CPU})},
        {"cpu": 10 * CPU, "mem": 100 * GIB},
        # a's dominant share is mem (.6), above b's cpu (.5), though a holds less cpu.
        ["b1", "a1"],
        id="dominant-slot-decides",
    ),
    pytest.param(
        [session(name="a1", owner=A, created=0), session(name="b1", owner=B, created=1)],
        {A: usage(0, {"gpu": 8 * CPU}), B: usage(0, {"cpu": CPU})},
        {"cpu": 10 * CPU, "gpu": 0},
        # gpu has no capacity in the group (no usable agent offers it): a holds share 0.
        ["a1", "b1"],
        id="slots-without-capacity-ignored",
    ),
    pytest.param(
        [session(name=f"a{i}", owner=A, created=i) for i in (1, 2, 3)]
        + [session(name=f"b{i}", owner=B, created=10 + i) for i in (1, 2, 3)],
        {},
        {},
        # No capacity at all: every share is 0, so owners alternate by sessions held.
        ["a1", "b1", "a2", "b2", "a3", "b3"],
        id="equal-shares-alternate-owners",
    ),
    pytest.param(
        [session(name="b1", owner=B, created=5), session(name="a1", owner=A, created=5)],
        {},
        {"cpu": 10 * CPU},
        # Same share, sessions held and age: the lower owner id wins.
        ["a1", "b1"],
        id="last-tie-owner-id",
    ),
    pytest.param(
        [
            session(name="a-low", owner=A, created=0, priority=0),
            session(name="b-high", owner=B, created=5, priority=1),
            session(name="a-high", owner=A, created=9, priority=1),
        ],
        {A: usage(3, {"cpu": 9 * CPU})},
        {"cpu": 10 * CPU},
        ["b-high", "a-high", "a-low"],
        id="priority-dominates-share",
    ),
    pytest.param(
        [
            session(name="a-high", owner=A, created=0, priority=1, slots={"cpu": 6 * CPU}),
            session(name="a-low", owner=A, created=1, priority=0),
            session(name="b-low", owner=B, created=2, priority=0, slots={"cpu": 2 * CPU}),
        ],
        {},
        {"cpu": 10 * CPU},
        # What a higher priority queued for a counts against a at the lower one.
        ["a-high", "b-low", "a-low"],
        id="queued-share-carries-across-priorities",
    ),
    pytest.param(
        [
            session(name="a3", owner=A, created=10),
            session(name="a2", owner=A, created=9),
            session(name="a1", owner=A, created=1),
            session(name="b1", owner=B, created=5, kernels=4),
            session(name="b2", owner=B, created=6),
        ],
        {},
        {"cpu": 10 * CPU},
        # a's sessions go oldest first; b1's four kernels count as 4 cpu, so b waits at .4
        # while a climbs from .1 to .3.
        ["a1", "b1", "a2", "a3", "b2"],
        id="fifo-within-owner-and-all-kernels-count",
    ),
]


@pytest.mark.parametrize(("sessions", "held", "capacity", "expected"), DRF_CASES)
def test_drf_serves_the_owner_with_the_lowest_dominant_share(
    sessions: list[PendingSession],
    held: dict[int, OwnerUsage],
    capacity: dict[str, int],
    expected: list[str],
) -> None:
    """DRF picks the lowest dominant share, counting queued sessions, under priority."""
    assert _order(sessions, Sequencer.DRF, held=held, capacity=capacity) == expected


def test_drf_leaves_the_callers_usage_untouched() -> None:
    """Ordering is pure: the usage mapping passed in is not charged with queued sessions."""
    held = {user(A): usage(1, {"cpu": CPU})}
    order_sessions(
        [session(owner=A), session(owner=B)],
        Sequencer.DRF,
        usage=held,
        group_capacity={"cpu": 10 * CPU},
    )
    assert held == {user(A): usage(1, {"cpu": CPU})}


def test_dominant_share_is_the_largest_fraction_over_slots_with_capacity() -> None:
    """The share is max(held / capacity) over slots with capacity; nothing held is 0."""
    capacity = {"cpu": 10 * CPU, "mem": 100 * GIB, "gpu": 0}
    assert dominant_share({"cpu": 2 * CPU, "mem": 50 * GIB, "gpu": 4}, capacity) == 0.5
    assert dominant_share({}, capacity) == 0.0
    assert dominant_share({"cpu": CPU}, {}) == 0.0


def test_usable_capacity_sums_usable_agents_only() -> None:
    """DRF's denominator counts the capacity of usable agents per slot column."""
    agents = pool(
        {"a1": {"cpu": 4 * CPU}, "a2": {"cpu": 8 * CPU, "gpu": 2 * CPU}, "a3": {"cpu": 99}},
        usable=["a1", "a2"],
    )
    assert usable_capacity(agents) == {"cpu": 12 * CPU, "gpu": 2 * CPU}


# --- determinism and properties --------------------------------------------------------------


@pytest.mark.parametrize("sequencer", list(Sequencer))
def test_order_does_not_depend_on_input_order(sequencer: Sequencer) -> None:
    """Every sequencer gives the same order for the same sessions however they arrive."""
    sessions = [
        session(id=i + 1, owner=1 + i % 3, priority=i % 2, created=i % 4, kernels=1 + i % 3)
        for i in range(12)
    ]
    held = {A: usage(1, {"cpu": 2 * CPU})}
    forward = _order(sessions, sequencer, held=held)
    assert _order(list(reversed(sessions)), sequencer, held=held) == forward
    assert _order(sessions[::2] + sessions[1::2], sequencer, held=held) == forward


_SESSION_FIELDS = st.tuples(
    st.integers(1, 4),  # owner
    st.integers(-2, 2),  # priority
    st.integers(0, 5),  # created, seconds after T0
    st.integers(0, 4 * CPU),  # cpu per kernel
    st.integers(1, 3),  # kernels
)


@given(
    fields=st.lists(_SESSION_FIELDS, max_size=25),
    sequencer=st.sampled_from(list(Sequencer)),
    held_cpu=st.dictionaries(st.integers(1, 4), st.integers(0, 20 * CPU), max_size=4),
    capacity_cpu=st.integers(0, 40 * CPU),
    data=st.data(),
)
def test_order_is_a_permutation_non_increasing_in_priority(
    fields: list[tuple[int, int, int, int, int]],
    sequencer: Sequencer,
    held_cpu: dict[int, int],
    capacity_cpu: int,
    data: st.DataObject,
) -> None:
    """Any input comes back whole, each session once, priorities never rising, input-order-free."""
    sessions = [
        session(
            id=i + 1,
            owner=owner,
            priority=priority,
            created=created,
            slots={"cpu": cpu},
            kernels=kernels,
        )
        for i, (owner, priority, created, cpu, kernels) in enumerate(fields)
    ]
    held: dict[UserId, OwnerUsage] = {
        user(owner): usage(1, {"cpu": cpu}) for owner, cpu in held_cpu.items()
    }
    capacity = {"cpu": capacity_cpu}
    ordered = order_sessions(sessions, sequencer, usage=held, group_capacity=capacity)

    assert sorted(s.id for s in ordered) == sorted(s.id for s in sessions)
    priorities = [s.priority for s in ordered]
    assert priorities == sorted(priorities, reverse=True)
    shuffled = data.draw(st.permutations(sessions))
    again = order_sessions(shuffled, sequencer, usage=held, group_capacity=capacity)
    assert [s.id for s in again] == [s.id for s in ordered]
