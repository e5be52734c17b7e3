"""Placement: from a group's snapshot to a plan, with a decision and a reason for every session.

Pure given the snapshot. Sessions are taken in the sequencer's order; each is validated, then
placed all or nothing by the group's selector. The head-of-line rule: when a session does not
fit for lack of resources, under strict ordering the sessions after it wait behind it for this
pass (they must not take the capacity it waits for); a session-specific reason (a dependency,
an owner limit, a permanent failure) never stops the pass.
"""

from __future__ import annotations

from collections.abc import Callable

from corral.domain.resource_group import Ordering
from corral.domain.session import PendingSession
from corral.domain.types import SessionId
from corral.scheduler.requests import InvalidRequestError, Request, RequestCache, format_milli
from corral.scheduler.selectors import AgentChooser
from corral.scheduler.sequencers import order_sessions, usable_capacity
from corral.scheduler.types import Decision, GroupSnapshot, Outcome, Plan, Verdict, VerdictKind
from corral.scheduler.validators import ValidationContext, validate
from corral.store.placements import KernelPlacement, SessionPlacement

NO_CAPACITY = "no_capacity"
WAITING_BEHIND = "waiting_behind"
# All-or-nothing admission's `block_admission`: an admitted session is not ready yet.
ADMISSION_BLOCKED = "admission_blocked"


def place_sessions(
    snapshot: GroupSnapshot,
    *,
    on_batch: Callable[[list[SessionPlacement]], None] | None = None,
    first_batch: int = 500,
) -> Plan:
    """Decide, for every candidate of the snapshot, placed (and where) or why not.

    `on_batch`, if given, is handed the placements as they are made (each batch a new list),
    so that they can be written while the rest of the plan is being made: `first_batch` of
    them first, each batch after twice the one before, and what is left at the end.
    """
    handed_over = 0
    batch_size = first_batch
    pool = snapshot.agents
    options = snapshot.options
    requests = RequestCache(pool.slot_index)
    # A request no array can hold is set aside before anything else reads it (ordering sums
    # requests too): its session is isolated, and the pass goes on with the rest.
    invalid: dict[SessionId, str] = {}
    placeable: list[PendingSession] = []
    for session in snapshot.pending:
        try:
            requests.get(session)
        except InvalidRequestError as exc:
            invalid[session.id] = str(exc)
        else:
            placeable.append(session)
    ordered = order_sessions(
        placeable,
        options.sequencer,
        usage=snapshot.usage,
        group_capacity=usable_capacity(pool),
        by_eviction=options.wait_for_kernels_ready.requeues_by_eviction,
    )
    ctx = ValidationContext.build(snapshot)
    chooser = AgentChooser(pool, options.selector)
    plan = Plan(order=[s.id for s in ordered], invalid=invalid)
    blocker: PendingSession | None = None
    # Blocking admission: the session whose kernels are not all ready yet (by its label); one
    # placed in this pass blocks the rest of it in turn.
    blocks = options.wait_for_kernels_ready.blocks
    admitting = None if snapshot.admission_blocker is None else str(snapshot.admission_blocker)

    for position, session in enumerate(ordered, start=1):
        request = requests.get(session)
        verdict = validate(session, request, ctx)
        if verdict is not None and verdict.kind is VerdictKind.FAIL:
            plan.decisions[session.id] = _decision(session, Outcome.FAILED, position, verdict)
            continue
        if verdict is not None:
            plan.decisions[session.id] = _decision(session, Outcome.WAITING, position, verdict)
            continue
        if blocker is not None:
            plan.decisions[session.id] = Decision(
                session.id,
                Outcome.BLOCKED,
                position,
                WAITING_BEHIND,
                f"waiting behind session {_label(blocker)}, which is next in line "
                f"in resource group {snapshot.group!r} and does not fit yet",
            )
            continue
        if admitting is not None:
            plan.decisions[session.id] = Decision(
                session.id,
                Outcome.BLOCKED,
                position,
                ADMISSION_BLOCKED,
                f"blocked by admission of session {admitting}, whose kernels are not all "
                f"ready yet (block_admission of resource group {snapshot.group!r})",
            )
            continue
        rows = chooser.place(
            request.per_kernel,
            multi_node=request.multi_node,
            avoid=chooser.mask_of(session.failed_agents) if session.failed_agents else None,
        )
        if rows is None:
            shortage = _shortage(snapshot, chooser, request)
            plan.decisions[session.id] = _decision(session, Outcome.WAITING, position, shortage)
            if options.ordering is Ordering.STRICT and blocker is None:
                blocker = session
                plan.blocker = session.id
            continue
        agent_ids = chooser.agent_ids(rows)
        plan.placements.append(
            SessionPlacement(
                session.id,
                tuple(
                    KernelPlacement(index, agent, slots)
                    for index, (slots, agent) in enumerate(
                        zip(session.kernel_slots, agent_ids, strict=True)
                    )
                ),
            )
        )
        ctx.add_placed(session, request)
        if blocks:
            admitting = _label(session)
            plan.blocker = plan.blocker or session.id  # the pass reads no further page
        plan.decisions[session.id] = Decision(
            session.id,
            Outcome.PLACED,
            position,
            message=f"placed on {', '.join(dict.fromkeys(agent_ids))}",
        )
        if on_batch is not None and len(plan.placements) - handed_over >= batch_size:
            on_batch(plan.placements[handed_over:])
            handed_over = len(plan.placements)
            batch_size *= 2
    if on_batch is not None and len(plan.placements) > handed_over:
        on_batch(plan.placements[handed_over:])
    return plan


def _decision(
    session: PendingSession, outcome: Outcome, position: int, verdict: Verdict
) -> Decision:
    return Decision(session.id, outcome, position, verdict.code, verdict.message)


def _shortage(snapshot: GroupSnapshot, chooser: AgentChooser, request: Request) -> Verdict:
    names = snapshot.agents.slot_names
    if not chooser.usable.any():
        return Verdict(
            VerdictKind.SHORTAGE,
            NO_CAPACITY,
            f"no agent of resource group {snapshot.group!r} is available now "
            "(all are lost or drained)",
        )
    largest = format_milli(dict(zip(names, (int(x) for x in chooser.largest_free()), strict=True)))
    if request.multi_node:
        per_kernel = format_milli(
            dict(zip(names, (int(x) for x in request.per_kernel.max(axis=0)), strict=True))
        )
        wanted = f"{request.kernels} kernels of {per_kernel}, one agent each where possible"
    else:
        wanted = format_milli(dict(zip(names, (int(x) for x in request.total), strict=True)))
        wanted = f"{wanted} on one agent"
    return Verdict(
        VerdictKind.SHORTAGE,
        NO_CAPACITY,
        f"no agent has room now for {wanted} (most free on one agent: {largest or 'nothing'})",
    )


def _label(session: PendingSession) -> str:
    short = str(session.id)[:8]
    return f"{session.name} ({short})" if session.name else short
