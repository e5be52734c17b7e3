"""A job array's throttle: at most N of its elements active, a wait that does not block others."""

from __future__ import annotations

from corral.domain.resource_group import Ordering, ResourceGroupOptions
from corral.domain.session import PendingSession
from corral.scheduler.planner import place_sessions
from corral.scheduler.types import Outcome
from corral.scheduler.validators import ARRAY_THROTTLE
from tests.unit.scheduler._builders import cpu_pool, session, snapshot

ARRAY = 1000  # the array's id (its first element's), as `session_id(ARRAY)`


def _elements(count: int, throttle: int, *, first: int = 0) -> list[PendingSession]:
    return [
        session(id=ARRAY + i, created=i, array=(ARRAY, throttle), name=f"e{i}")
        for i in range(first, first + count)
    ]


def test_no_more_than_the_throttle_are_placed_in_one_pass() -> None:
    """Ten elements with room for all and a throttle of 3: the first three are placed."""
    plan = place_sessions(
        snapshot(pending=_elements(10, 3), agents=cpu_pool({"a1": 64}, capacity=64))
    )
    placed = [p.session_id for p in plan.placements]
    assert len(placed) == 3
    waiting = [d for d in plan.decisions.values() if d.outcome is Outcome.WAITING]
    assert len(waiting) == 7
    assert {d.code for d in waiting} == {ARRAY_THROTTLE}
    assert waiting[0].message.startswith("array throttle 3 reached: 3 elements of array")


def test_elements_already_active_count_against_the_throttle() -> None:
    """With two of five already active, one more is placed; with five, none."""
    two = place_sessions(
        snapshot(
            pending=_elements(5, 5),
            agents=cpu_pool({"a1": 64}, capacity=64),
            array_active={ARRAY: 4},
        )
    )
    assert len(two.placements) == 1
    full = place_sessions(
        snapshot(
            pending=_elements(5, 5),
            agents=cpu_pool({"a1": 64}, capacity=64),
            array_active={ARRAY: 5},
        )
    )
    assert full.placements == []
    assert full.blocker is None


def test_a_throttled_element_does_not_hold_back_later_sessions_under_strict_ordering() -> None:
    """The throttle is session-specific: sessions queued after the array's waiting elements
    are placed in the same pass (the head-of-line rule does not apply)."""
    other = session(id=1, created=100, name="other")
    options = ResourceGroupOptions(ordering=Ordering.STRICT)
    plan = place_sessions(
        snapshot(
            pending=[*_elements(4, 1), other],
            agents=cpu_pool({"a1": 64}, capacity=64),
            options=options,
        )
    )
    placed = {p.session_id for p in plan.placements}
    assert other.id in placed
    assert len(placed) == 2  # one element and the other session
    assert plan.blocker is None


def test_arrays_are_throttled_each_on_its_own() -> None:
    """Two arrays with a throttle of 1 each: one element of each is placed."""
    second = [session(id=2000 + i, created=50 + i, array=(2000, 1), name=f"f{i}") for i in range(3)]
    plan = place_sessions(
        snapshot(pending=[*_elements(3, 1), *second], agents=cpu_pool({"a1": 64}, capacity=64))
    )
    assert {p.session_id for p in plan.placements} == {
        _elements(1, 1)[0].id,
        second[0].id,
    }


def test_elements_without_room_are_a_shortage_not_a_throttle() -> None:
    """A throttle not reached leaves the usual capacity reasons: two cpus, three elements of
    one cpu, throttle 5: two are placed and the third waits for capacity."""
    plan = place_sessions(snapshot(pending=_elements(3, 5), agents=cpu_pool({"a1": 2}, capacity=2)))
    assert len(plan.placements) == 2
    third = plan.decisions[_elements(3, 5)[2].id]
    assert third.outcome is Outcome.WAITING
    assert third.code != ARRAY_THROTTLE
