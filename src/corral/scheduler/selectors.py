"""Choosing agents for kernels, vectorised over the agents of a pool.

`AgentChooser` works on a private copy of the pool's free space. For every distinct request it
keeps a boolean "fits" mask over the agents (rows of one 2-D array); placing or removing a
kernel changes one agent, so only that agent's column is recomputed, for all requests in one
operation. Choosing an agent is then one masked arg-min or arg-max over the agents, with no
Python loop over them; the equal kernels of a multi-node session take their agents in one sort.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from corral.domain.resource_group import Selector
from corral.domain.types import AgentId
from corral.scheduler.types import AgentPool, BoolArray, Int64Array

_INITIAL_SHAPES = 16


class AgentChooser:
    """Places requests on a working copy of a pool's free capacity, by one selector's rule."""

    def __init__(self, pool: AgentPool, selector: Selector) -> None:
        self.pool = pool
        self.selector = selector
        self.free: Int64Array = pool.free.copy()
        self.usable: BoolArray = pool.usable.copy()
        self.index = {agent: i for i, agent in enumerate(pool.ids)}
        # Summed as floats (weights are floats anyway): a group's total need not fit 64 bits.
        total = (
            pool.capacity[pool.usable].sum(axis=0, dtype=np.float64)
            if len(pool.ids)
            else np.zeros(0)
        )
        # Each slot weighs by its share of the group, so "how full" compares cpu and memory.
        self._weights: npt.NDArray[np.float64] = 1.0 / np.where(total > 0, total, 1)
        self._load: npt.NDArray[np.float64] = self.free @ self._weights
        # Cached requests (rows of _needs) and, per request, which agents it fits (_masks).
        self._shapes: dict[bytes, int] = {}
        self._needs: Int64Array = np.zeros((_INITIAL_SHAPES, len(pool.slot_names)), np.int64)
        self._masks: BoolArray = np.zeros((_INITIAL_SHAPES, len(pool.ids)), dtype=bool)
        self._next = 0  # round-robin pointer
        self._uniform: dict[bytes, bool] = {}  # per multi-node request: its kernels are equal

    def fits(self, need: Int64Array) -> BoolArray:
        """Usable agents whose free capacity holds `need` (a cached view: do not modify)."""
        key = need.tobytes()
        row = self._shapes.get(key)
        if row is None:
            row = len(self._shapes)
            if row == len(self._needs):
                self._needs = np.concatenate([self._needs, np.zeros_like(self._needs)])
                self._masks = np.concatenate([self._masks, np.zeros_like(self._masks)])
            self._needs[row] = need
            self._masks[row] = self.usable & (self.free >= need).all(axis=1)
            self._shapes[key] = row
        mask: BoolArray = self._masks[row]
        return mask

    def place(
        self, per_kernel: Int64Array, *, multi_node: bool, avoid: BoolArray | None = None
    ) -> list[int] | None:
        """Agent rows for each kernel, or None (and nothing taken) if the request does not fit.

        Single-node: one agent holds the sum of all kernels. Multi-node: one agent per kernel,
        distinct agents preferred, largest kernels first (so a small kernel cannot take the only
        agent a large one fits on). Agents in `avoid` (they failed this session) come last of
        all, after sharing an agent between kernels.
        """
        if not multi_node:
            need = per_kernel.sum(axis=0)
            agent = self._choose(self.fits(need), avoid, None)
            if agent is None:
                return None
            self._take(agent, need)
            return [agent] * per_kernel.shape[0]
        if self._alike(per_kernel):
            alike = self._place_alike(per_kernel[0], per_kernel.shape[0], avoid)
            if alike is not None:
                return alike
        order = np.argsort(-(per_kernel @ self._weights), kind="stable")
        chosen: dict[int, int] = {}
        used = np.zeros(len(self.pool.ids), dtype=bool)
        turn = self._next
        for kernel in order:
            row = per_kernel[kernel]
            agent = self._choose(self.fits(row), avoid, used)
            if agent is None:
                for taken_kernel, taken in chosen.items():
                    self._give(taken, per_kernel[taken_kernel])
                self._next = turn
                return None
            self._take(agent, row)
            used[agent] = True
            chosen[int(kernel)] = agent
        return [chosen[k] for k in range(per_kernel.shape[0])]

    def _place_alike(
        self, need: Int64Array, kernels: int, avoid: BoolArray | None
    ) -> list[int] | None:
        """`kernels` equal kernels on as many distinct agents, all chosen in one step.

        None (nothing taken) when fewer fresh agents outside `avoid` have room: then kernels
        share or use failed agents, and the per-kernel loop settles which. Otherwise the loop's
        every choice is from the fresh agents outside `avoid`, whose loads do not change while
        it runs, so its choices are the first `kernels` agents in the selector's order: by
        (load, row) for concentrated, (-load, row) for dispersed (arg-min and arg-max take the
        lowest row of a tie, as the stable sort does), cyclically from the pointer for
        round-robin.
        """
        candidates = self.fits(need)
        if avoid is not None:
            candidates = candidates & ~avoid
        rows = candidates.nonzero()[0]
        if rows.size < kernels:
            return None
        if self.selector is Selector.CONCENTRATED:
            picked = rows[self._load[rows].argsort(kind="stable")[:kernels]]
        elif self.selector is Selector.DISPERSED:
            picked = rows[(-self._load[rows]).argsort(kind="stable")[:kernels]]
        else:
            start = int(rows.searchsorted(self._next))
            picked = rows.take(np.arange(start, start + kernels), mode="wrap")
            self._next = int(picked[-1]) + 1
        free = self.free[picked] - need
        self.free[picked] = free
        # A stack of 1 x n by n x 1 products: numpy computes each as the vector dot product
        # `_changed` uses (one matrix-vector product could round differently, and a load off
        # in its last bit can turn a tie).
        self._load[picked] = (free[:, None, :] @ self._weights[:, None]).ravel()
        count = len(self._shapes)
        # The agents were candidates, so usable: their masks are where they still fit.
        self._masks[:count, picked] = (self._needs[:count, None] <= free).all(axis=2)
        chosen: list[int] = picked.tolist()
        return chosen

    def _alike(self, per_kernel: Int64Array) -> bool:
        """Whether a multi-node request's kernels all ask the same (memoised per request)."""
        key = per_kernel.tobytes()
        alike = self._uniform.get(key)
        if alike is None:
            alike = self._uniform[key] = bool(
                per_kernel.shape[0] and (per_kernel == per_kernel[0]).all()
            )
        return alike

    def agent_ids(self, rows: Sequence[int]) -> list[AgentId]:
        """The agent ids of pool rows."""
        return [self.pool.ids[r] for r in rows]

    def mask_of(self, agent_ids: Sequence[AgentId]) -> BoolArray | None:
        """A mask of the given agents (None when none of them is in the pool)."""
        rows = [self.index[a] for a in agent_ids if a in self.index]
        if not rows:
            return None
        mask = np.zeros(len(self.pool.ids), dtype=bool)
        mask[rows] = True
        return mask

    def largest_free(self) -> Int64Array:
        """Per slot, the most free capacity on any usable agent."""
        if not self.usable.any():
            return np.zeros(len(self.pool.slot_names), dtype=np.int64)
        result: Int64Array = self.free[self.usable].max(axis=0)
        return result

    def _choose(
        self, candidates: BoolArray, avoid: BoolArray | None, used: BoolArray | None
    ) -> int | None:
        if not candidates.any():
            return None
        # Preference: a fresh healthy agent, then sharing a healthy one, then a fresh agent that
        # failed this session before; anything that fits only as the last resort.
        tiers: list[BoolArray] = []
        if used is not None and avoid is not None:
            tiers.append(candidates & ~used & ~avoid)
        if avoid is not None:
            tiers.append(candidates & ~avoid)
        if used is not None:
            tiers.append(candidates & ~used)
        for tier in tiers:
            if tier.any():
                return self._pick(tier)
        return self._pick(candidates)

    def _pick(self, candidates: BoolArray) -> int:
        if self.selector is Selector.CONCENTRATED:
            return int(np.where(candidates, self._load, np.inf).argmin())
        if self.selector is Selector.DISPERSED:
            return int(np.where(candidates, self._load, -np.inf).argmax())
        rows = np.flatnonzero(candidates)
        after = rows[rows >= self._next]
        agent = int(after[0] if after.size else rows[0])
        self._next = agent + 1
        return agent

    def _take(self, agent: int, need: Int64Array) -> None:
        self.free[agent] -= need
        self._changed(agent)

    def _give(self, agent: int, need: Int64Array) -> None:
        self.free[agent] += need
        self._changed(agent)

    def _changed(self, agent: int) -> None:
        free = self.free[agent]
        self._load[agent] = float(free @ self._weights)
        count = len(self._shapes)
        if count:
            fits = (free >= self._needs[:count]).all(axis=1)
            self._masks[:count, agent] = fits & self.usable[agent]
