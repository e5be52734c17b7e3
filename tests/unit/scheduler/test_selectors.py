"""AgentChooser: each selector's rule, failed agents last, usable agents only, all or nothing."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.domain.resource_group import Selector
from corral.scheduler.selectors import AgentChooser
from corral.scheduler.types import AgentPool, BoolArray, Int64Array
from tests.unit.scheduler._builders import CPU, GIB, cpu_pool, pool

PACK, SPREAD, TURN = Selector.CONCENTRATED, Selector.DISPERSED, Selector.ROUNDROBIN


def _need(*cpus: int) -> Int64Array:
    """A per-kernel request over a cpu-only pool: one row per kernel."""
    return np.array([[n * CPU] for n in cpus], dtype=np.int64)


def _place(
    chooser: AgentChooser, *cpus: int, multi: bool = False, avoid: Sequence[str] = ()
) -> list[str] | None:
    rows = chooser.place(
        _need(*cpus), multi_node=multi, avoid=chooser.mask_of(avoid) if avoid else None
    )
    return None if rows is None else [str(a) for a in chooser.agent_ids(rows)]


def _fresh_masks_agree(chooser: AgentChooser, needs: Sequence[Int64Array]) -> bool:
    """Every cached fits mask equals the one computed from scratch on the current free space."""
    return all(
        np.array_equal(chooser.fits(need), chooser.usable & (chooser.free >= need).all(axis=1))
        for need in needs
    )


# --- one choice per selector -----------------------------------------------------------------

FREE = {"a": 2, "b": 8, "c": 4}


@pytest.mark.parametrize(
    ("selector", "cpus", "expected"),
    [
        pytest.param(PACK, 1, "a", id="concentrated-least-free"),
        pytest.param(PACK, 3, "c", id="concentrated-least-free-that-fits"),
        pytest.param(SPREAD, 1, "b", id="dispersed-most-free"),
        pytest.param(SPREAD, 8, "b", id="dispersed-only-one-fits"),
        pytest.param(TURN, 1, "a", id="roundrobin-first-in-turn"),
        pytest.param(TURN, 3, "b", id="roundrobin-skips-what-does-not-fit"),
        pytest.param(PACK, 9, None, id="nothing-fits"),
    ],
)
def test_each_selector_chooses_by_its_rule(
    selector: Selector, cpus: int, expected: str | None
) -> None:
    """Pack takes the least free agent that fits, spread the most free, round-robin the next."""
    chooser = AgentChooser(cpu_pool(FREE), selector)
    assert _place(chooser, cpus) == (None if expected is None else [expected])


@pytest.mark.parametrize(("selector", "expected"), [(PACK, "a"), (SPREAD, "a")])
def test_ties_go_to_the_agent_listed_first(selector: Selector, expected: str) -> None:
    """Among equally free agents, both pack and spread take the first in pool order."""
    assert _place(AgentChooser(cpu_pool({"a": 4, "b": 4}), selector), 1) == [expected]


def test_slots_weigh_by_their_share_of_the_group() -> None:
    """'How free' compares slots by share of group capacity, so memory bytes do not drown cpu."""
    agents = pool(
        {a: {"cpu": 4 * CPU, "mem": 4 * GIB} for a in ("a", "b")},
        # a: 1/8 cpu + 2/8 mem free of the group; b: 4/8 cpu + 1/8 mem (fewer raw units).
        occupied={"a": {"cpu": 3 * CPU, "mem": 2 * GIB}, "b": {"mem": 3 * GIB}},
    )
    need = np.array([[CPU, 0]], dtype=np.int64)  # one cpu, no memory
    assert agents.slot_names == ["cpu", "mem"]
    for selector, expected in ((PACK, "a"), (SPREAD, "b")):
        chooser = AgentChooser(agents, selector)
        rows = chooser.place(need, multi_node=False)
        assert rows is not None
        assert chooser.agent_ids(rows) == [expected]


@pytest.mark.parametrize(
    ("free", "requests", "expected"),
    [
        pytest.param({"a": 8, "b": 8, "c": 8}, [1] * 4, ["a", "b", "c", "a"], id="wraps"),
        pytest.param({"a": 8, "b": 8, "c": 0}, [1] * 3, ["a", "b", "a"], id="wraps-past-full"),
        pytest.param({"a": 1, "b": 8, "c": 8}, [1] * 4, ["a", "b", "c", "b"], id="skips-full"),
    ],
)
def test_roundrobin_takes_agents_in_turn_and_wraps(
    free: dict[str, int], requests: list[int], expected: list[str]
) -> None:
    """Round-robin continues after the last agent it chose and wraps to the first that fits."""
    chooser = AgentChooser(cpu_pool(free), TURN)
    assert [(_place(chooser, n) or ["-"])[0] for n in requests] == expected


# --- failed agents last, unusable agents never -----------------------------------------------


@pytest.mark.parametrize(
    ("selector", "free", "avoid", "expected"),
    [
        pytest.param(PACK, {"a": 2, "b": 8}, ["a"], "b", id="concentrated"),
        pytest.param(SPREAD, {"a": 2, "b": 8}, ["b"], "a", id="dispersed"),
        pytest.param(TURN, {"a": 2, "b": 8}, ["a"], "b", id="roundrobin"),
        pytest.param(PACK, {"a": 2, "b": 8}, ["zz"], "a", id="unknown-failed-agent-ignored"),
        pytest.param(PACK, {"a": 8, "b": 0}, ["a"], "a", id="failed-agent-when-nothing-else"),
        pytest.param(SPREAD, {"a": 2, "b": 2}, ["a", "b"], "a", id="all-failed-rule-applies"),
    ],
)
def test_agents_that_failed_the_session_come_last(
    selector: Selector, free: dict[str, int], avoid: list[str], expected: str
) -> None:
    """An agent the session already failed on is used only when no other agent fits."""
    assert _place(AgentChooser(cpu_pool(free), selector), 1, avoid=avoid) == [expected]


def test_failed_agents_come_last_for_every_kernel_of_a_multi_node_session() -> None:
    """Multi-node kernels avoid failed agents too, falling back to them only when needed."""
    agents = cpu_pool({"a": 8, "b": 1, "c": 1})
    assert _place(AgentChooser(agents, SPREAD), 1, 1, multi=True, avoid=["a"]) == ["b", "c"]
    assert _place(AgentChooser(agents, SPREAD), 1, 1, 1, multi=True, avoid=["a"]) == [
        "b",
        "c",
        "a",
    ]


@pytest.mark.parametrize("selector", list(Selector))
def test_kernels_share_a_healthy_agent_before_using_one_that_failed(selector: Selector) -> None:
    """ "Failed agents are tried last" outranks "distinct agents preferred" for multi-node."""
    agents = cpu_pool({"failed": 8, "healthy": 2})
    chooser = AgentChooser(agents, selector)
    assert _place(chooser, 1, 1, multi=True, avoid=["failed"]) == ["healthy", "healthy"]
    assert _place(chooser, 1, multi=True, avoid=["failed"]) == ["failed"]


@pytest.mark.parametrize("selector", list(Selector))
def test_unusable_agents_are_never_chosen(selector: Selector) -> None:
    """Lost or drained agents take nothing, however well they would fit."""
    chooser = AgentChooser(cpu_pool({"a": 1, "big": 8, "c": 1}, usable=["a", "c"]), selector)
    assert not chooser.fits(_need(1)[0])[1]
    placed = [_place(chooser, 1), _place(chooser, 1), _place(chooser, 1)]
    assert sorted(p[0] for p in placed[:2] if p) == ["a", "c"]
    assert placed[2] is None
    assert _place(chooser, 2, multi=True) is None
    assert chooser.largest_free().tolist() == [0]


def test_no_usable_agent_places_nothing() -> None:
    """With every agent unusable nothing fits and the largest free space is zero."""
    chooser = AgentChooser(cpu_pool({"a": 8}, usable=[]), PACK)
    assert _place(chooser, 1) is None
    assert chooser.largest_free().tolist() == [0]


def test_mask_of_ignores_agents_not_in_the_pool() -> None:
    """Failed agents that left the pool are dropped; none left gives no mask at all."""
    chooser = AgentChooser(cpu_pool({"a": 1, "b": 1}), PACK)
    assert chooser.mask_of(["gone"]) is None
    mask = chooser.mask_of(["gone", "b"])
    assert mask is not None
    assert mask.tolist() == [False, True]


# --- cluster requests: single-node, multi-node, all or nothing -------------------------------


def test_single_node_puts_the_sum_of_all_kernels_on_one_agent() -> None:
    """A single-node session takes one agent holding every kernel's request together."""
    chooser = AgentChooser(cpu_pool({"a": 3, "b": 4}), SPREAD)
    assert _place(chooser, 2, 2) == ["b", "b"]
    assert chooser.free[:, 0].tolist() == [3 * CPU, 0]
    assert _place(chooser, 2, 2) is None  # a has 3 free: kernels never split across agents


@pytest.mark.parametrize(
    ("free", "cpus", "expected"),
    [
        pytest.param({"a": 8, "b": 8, "c": 8}, [2, 2, 2], ["a", "b", "c"], id="distinct"),
        pytest.param({"a": 4, "b": 1}, [1, 1, 1], ["b", "a", "a"], id="share-when-short"),
        pytest.param({"a": 1, "b": 1}, [1, 1, 1], None, id="does-not-fit"),
    ],
)
def test_multi_node_prefers_distinct_agents(
    free: dict[str, int], cpus: list[int], expected: list[str] | None
) -> None:
    """One agent per kernel; kernels share an agent only when too few distinct agents have room."""
    assert _place(AgentChooser(cpu_pool(free), PACK), *cpus, multi=True) == expected


@pytest.mark.parametrize("selector", list(Selector))
def test_a_request_failing_midway_leaves_everything_as_before(selector: Selector) -> None:
    """A multi-node request failing after placing some kernels gives back exactly what it took."""
    agents = cpu_pool({"a": 2, "b": 1, "c": 0})
    chooser = AgentChooser(agents, selector)
    needs = [_need(1)[0], _need(2)[0], _need(3)[0]]
    before = chooser.free.copy()
    assert _place(chooser, 1, 1, 1, 1, multi=True) is None
    assert np.array_equal(chooser.free, before)
    assert _fresh_masks_agree(chooser, needs)
    fresh = AgentChooser(agents, selector)
    # Same free space, same next choices (load and masks restored too).
    assert _place(chooser, 2) == _place(fresh, 2)
    assert _place(chooser, 1) == _place(fresh, 1)


def test_the_chooser_never_writes_to_the_pool() -> None:
    """Placements change the chooser's copy only; the snapshot's pool stays as read."""
    agents = cpu_pool({"a": 4, "b": 4})
    before = agents.free.copy()
    chooser = AgentChooser(agents, PACK)
    assert _place(chooser, 4) == ["a"]
    assert np.array_equal(agents.free, before)


@pytest.mark.parametrize("selector", [SPREAD, TURN])
def test_multi_node_with_unequal_kernels_places_them_when_an_assignment_exists(
    selector: Selector,
) -> None:
    """A 1-cpu and a 4-cpu kernel on agents with 4 and 1 free cpus go one per agent."""
    chooser = AgentChooser(cpu_pool({"big": 4, "small": 1}), selector)
    assert _place(chooser, 1, 4, multi=True) == ["small", "big"]


# --- the fits cache --------------------------------------------------------------------------


@st.composite
def _pools(draw: st.DrawFn) -> AgentPool:
    count = draw(st.integers(1, 6))
    capacity = [draw(st.integers(0, 6)) for _ in range(count)]
    held = [draw(st.integers(0, c)) for c in capacity]
    usable = [f"a{i}" for i in range(count) if draw(st.booleans()) or i == 0]
    return pool(
        {f"a{i}": {"cpu": c * CPU, "mem": c * GIB} for i, c in enumerate(capacity)},
        occupied={f"a{i}": {"cpu": h * CPU, "mem": h * GIB} for i, h in enumerate(held)},
        usable=usable,
    )


_kernel_rows = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=1, max_size=4)


@settings(max_examples=100, deadline=None)
@given(
    agents=_pools(),
    selector=st.sampled_from(list(Selector)),
    requests=st.lists(st.tuples(_kernel_rows, st.booleans()), min_size=1, max_size=20),
)
def test_fits_masks_stay_correct_through_places_and_rollbacks(
    agents: AgentPool,
    selector: Selector,
    requests: list[tuple[list[tuple[int, int]], bool]],
) -> None:
    """After any run of placements, failed or not, every cached mask matches a fresh one."""
    chooser = AgentChooser(agents, selector)
    seen: list[Int64Array] = []
    for rows, multi in requests:
        per_kernel = np.array([[c * CPU, m * GIB] for c, m in rows], dtype=np.int64)
        seen.extend([*per_kernel, per_kernel.sum(axis=0)])
        before = chooser.free.copy()
        placed = chooser.place(per_kernel, multi_node=multi)
        if placed is None:
            assert np.array_equal(chooser.free, before)
        else:
            assert all(chooser.usable[r] for r in placed)
        assert (chooser.free[chooser.usable] >= 0).all()
        assert _fresh_masks_agree(chooser, seen)


# --- equal kernels of a multi-node session, chosen in one step --------------------------------


class _KernelByKernel(AgentChooser):
    """The chooser with the one-step path for equal kernels turned off: the reference."""

    def _place_alike(self, need: Int64Array, kernels: int, avoid: BoolArray | None) -> None:
        return None


_requests = st.lists(
    st.tuples(
        st.integers(1, 4),  # kernels
        _kernel_rows,  # per-kernel rows, used when the kernels differ
        st.booleans(),  # alike: every kernel asks the first row's amounts
        st.none() | st.lists(st.booleans(), min_size=8, max_size=8),  # failed agents
    ),
    min_size=1,
    max_size=20,
)


@st.composite
def _larger_pools(draw: st.DrawFn) -> AgentPool:
    """Up to 8 agents of a few sizes, so loads tie often and multi-node kernels spread."""
    count = draw(st.integers(1, 8))
    capacity = [draw(st.integers(0, 4)) for _ in range(count)]
    held = [draw(st.integers(0, c)) for c in capacity]
    usable = [f"a{i}" for i in range(count) if draw(_mostly_true)]
    return pool(
        {f"a{i}": {"cpu": c * CPU, "mem": c * GIB} for i, c in enumerate(capacity)},
        occupied={f"a{i}": {"cpu": h * CPU, "mem": h * GIB} for i, h in enumerate(held)},
        usable=usable,
    )


_mostly_true = st.integers(0, 4).map(bool)


@settings(max_examples=300, deadline=None)
@given(
    agents=st.one_of(_pools(), _larger_pools()),
    selector=st.sampled_from(list(Selector)),
    requests=_requests,
)
def test_equal_kernels_in_one_step_choose_as_kernel_by_kernel(
    agents: AgentPool,
    selector: Selector,
    requests: list[tuple[int, list[tuple[int, int]], bool, list[bool] | None]],
) -> None:
    """Multi-node choices, failed agents or not, equal the per-kernel loop's, run after run."""
    fast, reference = AgentChooser(agents, selector), _KernelByKernel(agents, selector)
    seen: list[Int64Array] = []
    for kernels, rows, alike, failed in requests:
        amounts = [rows[0]] * kernels if alike else (rows * kernels)[:kernels]
        per_kernel = np.array([[c * CPU, m * GIB] for c, m in amounts], dtype=np.int64)
        seen.append(per_kernel[0])
        avoid = None if failed is None else np.array(failed[: len(agents.ids)], dtype=bool)
        assert fast.place(per_kernel, multi_node=True, avoid=avoid) == reference.place(
            per_kernel, multi_node=True, avoid=avoid
        )
        assert np.array_equal(fast.free, reference.free)
        assert all(np.array_equal(fast.fits(n), reference.fits(n)) for n in seen)
        # The state the next choice depends on, to the last bit of every load.
        assert np.array_equal(fast._load, reference._load)
        assert fast._next == reference._next
