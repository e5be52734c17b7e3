"""The order pending sessions of one resource group are considered in.

Priority always comes first, higher first. Within one priority the group's sequencer decides:
`fifo` (oldest first), `lifo` (newest first) or `drf`, dominant resource fairness (Ghodsi et al.,
NSDI 2011). An owner's dominant share is the largest fraction of any one slot of the group's
capacity that the owner holds; DRF repeatedly serves the owner whose dominant share is lowest,
counting what the owner holds now plus what this ordering has already queued for them, so a
heavy owner's sessions interleave with a light owner's instead of all going first.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections import deque
from collections.abc import Mapping, Sequence
from datetime import datetime

from corral.domain.resource_group import Sequencer
from corral.domain.session import PendingSession
from corral.domain.types import SessionId, UserId
from corral.scheduler.types import AgentPool, OwnerUsage

# A heap entry: share, sessions held, the owner's next session's created_at, owner.
_DrfEntry = tuple[float, int, datetime, UserId]


def order_sessions(
    pending: Sequence[PendingSession],
    sequencer: Sequencer,
    *,
    usage: Mapping[UserId, OwnerUsage],
    group_capacity: Mapping[str, int],
    by_eviction: bool = False,
) -> list[PendingSession]:
    """Order `pending` by priority (higher first), then by `sequencer` within each priority.

    `usage` is what each owner holds in the group now; `group_capacity` is the total capacity
    per slot of the group's usable agents (milli-units). Both only matter to DRF. Pure and
    deterministic: the same input always gives the same order.

    `by_eviction` (all-or-nothing admission's `requeuing.timestamp` = `eviction`): a session
    evicted for not becoming ready in time takes its place by the time of its last eviction,
    not of its creation, behind the sessions queued before it was evicted.
    """
    if by_eviction and any(s.evicted_at is not None for s in pending):
        originals = {s.id: s for s in pending}
        as_queued = [
            s if s.evicted_at is None else dataclasses.replace(s, created_at=s.evicted_at)
            for s in pending
        ]
        by_queue_time = order_sessions(
            as_queued, sequencer, usage=usage, group_capacity=group_capacity
        )
        return [originals[s.id] for s in by_queue_time]
    levels: dict[int, list[PendingSession]] = {}
    for session in pending:
        levels.setdefault(session.priority, []).append(session)
    drf = _DrfLedger(usage, group_capacity) if sequencer is Sequencer.DRF else None
    ordered: list[PendingSession] = []
    for priority in sorted(levels, reverse=True):
        level = levels[priority]
        if drf is not None:
            ordered.extend(drf.order(level))
        elif sequencer is Sequencer.LIFO:
            ordered.extend(newest_first(level))
        else:
            ordered.extend(oldest_first(level))
    return ordered


def oldest_first(sessions: Sequence[PendingSession]) -> list[PendingSession]:
    """FIFO: `created_at` ascending, ties broken by session id."""
    return sorted(sessions, key=_age)


def newest_first(sessions: Sequence[PendingSession]) -> list[PendingSession]:
    """LIFO: `created_at` descending, ties broken by session id (ascending)."""
    # Two stable sorts: id ascending survives the reversed sort on created_at.
    by_id = sorted(sessions, key=lambda s: s.id)
    return sorted(by_id, key=lambda s: s.created_at, reverse=True)


def usable_capacity(pool: AgentPool) -> dict[str, int]:
    """The total capacity per slot of the pool's usable agents (milli-units): DRF's denominator."""
    # Python integers: agents' amounts each fit 64 bits, their sum over a group need not.
    totals = pool.capacity[pool.usable].sum(axis=0, dtype=object)
    return {name: int(totals[i]) for i, name in enumerate(pool.slot_names)}


def dominant_share(held: Mapping[str, int], capacity: Mapping[str, int]) -> float:
    """The largest fraction of any slot's capacity that `held` takes (slots with capacity only)."""
    return max(
        (held.get(name, 0) / total for name, total in capacity.items() if total > 0),
        default=0.0,
    )


def _age(session: PendingSession) -> tuple[datetime, SessionId]:
    return (session.created_at, session.id)


class _DrfLedger:
    """Each owner's running holdings during one ordering, carried from one priority to the next.

    Sessions queued at a higher priority count against their owner at the lower ones too: the
    ordering as a whole is what DRF keeps fair.
    """

    def __init__(self, usage: Mapping[UserId, OwnerUsage], capacity: Mapping[str, int]) -> None:
        self._capacity = {name: total for name, total in capacity.items() if total > 0}
        self._held = {owner: dict(u.slots) for owner, u in usage.items()}
        self._sessions = {owner: u.sessions for owner, u in usage.items()}

    def order(self, level: Sequence[PendingSession]) -> list[PendingSession]:
        """DRF within one priority: O(n log owners), one heap entry per owner with sessions left."""
        queues: dict[UserId, deque[PendingSession]] = {}
        for session in oldest_first(level):
            queues.setdefault(session.owner_id, deque()).append(session)
        heap = [self._entry(owner, queue[0]) for owner, queue in queues.items()]
        heapq.heapify(heap)
        ordered: list[PendingSession] = []
        while heap:
            owner = heapq.heappop(heap)[-1]
            queue = queues[owner]
            session = queue.popleft()
            ordered.append(session)
            self._charge(owner, session)
            if queue:
                # Only this owner's share changed, so the other entries stay valid.
                heapq.heappush(heap, self._entry(owner, queue[0]))
        return ordered

    def _entry(self, owner: UserId, next_session: PendingSession) -> _DrfEntry:
        # Ties: fewer sessions held (now plus queued), then the older next session, then owner.
        share = dominant_share(self._held.get(owner, {}), self._capacity)
        held_sessions = self._sessions.get(owner, 0)
        return (share, held_sessions, next_session.created_at, owner)

    def _charge(self, owner: UserId, session: PendingSession) -> None:
        held = self._held.setdefault(owner, {})
        for name, amount in session.requested_total().items():
            held[name] = held.get(name, 0) + amount
        self._sessions[owner] = self._sessions.get(owner, 0) + 1
