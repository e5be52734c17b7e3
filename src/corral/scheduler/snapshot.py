"""Loading a resource group's scheduling snapshot: rows from the store, turned into arrays."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np

from corral.domain.outcome import DependencyKind
from corral.domain.resource_group import Ordering, ResourceGroupOptions, Sequencer
from corral.domain.session import PendingSession
from corral.domain.status import SessionStatus
from corral.domain.types import ADMIN_ROLE, AgentId, UserId
from corral.scheduler.types import (
    AgentPool,
    DependencyState,
    GroupSnapshot,
    OwnerAccess,
    OwnerUsage,
    QueuePage,
)
from corral.store.admission import read_admission_blocker
from corral.store.database import Database
from corral.store.scheduling import (
    AgentSlotRow,
    QueueRead,
    read_agent_slots,
    read_array_active,
    read_candidates,
    read_dependencies,
    read_group_options,
    read_owner_usage,
    read_owners,
    read_queue_page,
)

# A page of the queue ends where the group's free slots run out (`read_queue_page`), but holds
# at least PAGE_AT_LEAST_FIRST sessions on a pass's first page and twice as many on each page
# after it, up to PAGE_AT_LEAST (or the whole page, if smaller). A pass that fills the few
# slots a few ended jobs freed reads a few sessions more than fit, not 256 (each judged and
# noted as waiting). Sessions that take nothing of what is free (waiting for a dependency)
# still let a pass read on, in pages that grow.
PAGE_AT_LEAST_FIRST = 16
PAGE_AT_LEAST = 256


async def load_snapshot(
    db: Database,
    group: str,
    now: datetime,
    *,
    limit: int | None = None,
    page: QueuePage | None = None,
) -> GroupSnapshot:
    """Read everything placement needs for `group`.

    Each read is consistent alone, not with the others (`Database.read_statements`: on
    PostgreSQL no BEGIN and COMMIT round trips, two of a small pass's nineteen). Nothing here
    needs one state: the commit re-checks every placement under lock (the session still
    PENDING, the agent still usable, the capacity still free), only this pass adds to an
    owner's usage, and a dependency only ever finishes, so a later read of either can only be
    more permissive by what really happened.

    `limit` caps the candidates at the first sessions in the group's order; a DRF group's
    window is taken oldest first within each priority, since its order depends on usage.
    `page`: read that page of the queue, with the sessions' kernels (`GroupSnapshot.read`), if
    the group's queue is read in pages (`pages_queue`), else the whole queue so. A page ends
    early where the sessions demand more than the group has free in total (see
    `read_queue_page`); the agents' slots are read first for it.
    """
    if limit is not None and page is not None:
        raise ValueError("give load_snapshot either `limit` or `page`, not both")
    read = QueueRead([], more=False)
    async with db.read_statements() as conn:
        options = ResourceGroupOptions.model_validate(await read_group_options(db, conn, group))
        pool = build_pool(await read_agent_slots(conn, group))
        if page is not None:
            paged = pages_queue(options)
            read = await read_queue_page(
                conn,
                db.dialect,
                group,
                now,
                newest_first=options.sequencer is Sequencer.LIFO,
                by_eviction=options.wait_for_kernels_ready.requeues_by_eviction,
                limit=page.size if paged else None,
                after=page.after if paged else None,
                free=pool.free_in_total() if paged else None,
                at_least=page_at_least(page),
            )
            candidates = [PendingSession.of(s) for s in read.sessions]
        else:
            candidates = await read_candidates(
                conn,
                db.dialect,
                group,
                now,
                limit=limit,
                newest_first=options.sequencer is Sequencer.LIFO,
                by_eviction=options.wait_for_kernels_ready.requeues_by_eviction,
            )
        counts: dict[UserId, int] = {}
        slots: dict[UserId, dict[str, int]] = {}
        if _reads_owner_usage(options):
            counts, slots = await read_owner_usage(conn, db.dialect, group)
        dependencies = await read_dependencies(conn, db.dialect, [s.id for s in candidates])
        # Only throttled arrays are counted: without one, a pass reads nothing more.
        throttled = {s.array_id for s in candidates if s.array_id is not None and s.array_throttle}
        array_active = await read_array_active(conn, db.dialect, throttled) if throttled else {}
        judged = owners_to_judge(options, candidates)
        owners = await read_owners(conn, db.dialect, judged) if judged else {}
        admission_blocker = None
        if options.wait_for_kernels_ready.blocks and candidates:
            found = await read_admission_blocker(conn, group)
            admission_blocker = None if found is None else found[1]
    usage = {
        owner: OwnerUsage(sessions=counts.get(owner, 0), slots=slots.get(owner, {}))
        for owner in set(counts) | set(slots)
    }
    return GroupSnapshot(
        admission_blocker=admission_blocker,
        group=group,
        options=options,
        pending=candidates,
        agents=pool,
        usage=usage,
        dependencies={
            sid: [
                DependencyState(
                    dep,
                    SessionStatus(status) if status else None,
                    result,
                    DependencyKind(kind),
                    number,
                )
                for dep, kind, status, result, number in deps
            ]
            for sid, deps in dependencies.items()
        },
        now=now,
        read=read.sessions,
        more_queued=read.more,
        array_active=array_active,
        owners={
            owner: OwnerAccess(name, role == ADMIN_ROLE) for owner, (name, role) in owners.items()
        },
    )


def page_at_least(page: QueuePage) -> int:
    """The fewest sessions `page` holds, however little the group has free."""
    return min(page.size, PAGE_AT_LEAST, PAGE_AT_LEAST_FIRST << min(page.number, 16))


def owners_to_judge(
    options: ResourceGroupOptions, candidates: Sequence[PendingSession]
) -> set[UserId]:
    """The owners whose name or role the group's access rules need: every candidate's when
    the group lists its users, else those of sessions above the group's max_user_priority
    (none in a group whose sessions keep to it, so a usual pass reads no user)."""
    if options.allowed_users is not None:
        return {s.owner_id for s in candidates}
    ceiling = options.max_user_priority
    return {s.owner_id for s in candidates if s.priority > ceiling}


def pages_queue(options: ResourceGroupOptions) -> bool:
    """Whether a pass may read the group's queue a page at a time and stop at a blocker.

    Under strict ordering with FIFO or LIFO, a session's place in the queue depends on itself
    alone (also when evicted sessions take theirs by their last eviction: the page's SQL
    orders by it), and nothing after a session that waits for capacity can be placed. DRF
    orders by what every owner holds and best-effort ordering lets later sessions pass: both
    need the whole queue.
    """
    return options.ordering is Ordering.STRICT and options.sequencer is not Sequencer.DRF


def _reads_owner_usage(options: ResourceGroupOptions) -> bool:
    """Whether placement in a group with `options` looks at what owners hold (limits, DRF)."""
    return (
        options.sequencer is Sequencer.DRF
        or options.max_sessions_per_owner is not None
        or options.max_slots_per_owner is not None
    )


def build_pool(rows: Sequence[AgentSlotRow]) -> AgentPool:
    """Arrays of capacity and free space, one row per agent, one column per slot name."""
    agent_ids = list(dict.fromkeys(row.agent_id for row in rows))
    slot_names = sorted({row.slot_name for row in rows if row.slot_name is not None})
    if not agent_ids:
        return AgentPool.empty()
    agent_index = {agent: i for i, agent in enumerate(agent_ids)}
    slot_index = {name: i for i, name in enumerate(slot_names)}
    capacity = np.zeros((len(agent_ids), len(slot_names)), dtype=np.int64)
    occupied = np.zeros_like(capacity)
    usable = np.zeros(len(agent_ids), dtype=bool)
    for row in rows:
        a = agent_index[row.agent_id]
        usable[a] = row.usable
        if row.slot_name is not None:
            capacity[a, slot_index[row.slot_name]] = row.capacity
            occupied[a, slot_index[row.slot_name]] = row.occupied
    return AgentPool(
        ids=[AgentId(a) for a in agent_ids],
        slot_names=slot_names,
        capacity=capacity,
        free=capacity - occupied,
        usable=usable,
    )
