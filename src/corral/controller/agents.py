"""The manager's side of the agent protocol, independent of the transport.

The HTTP routes (`api/agents.py`) and the in-process transport of `corral simulate` call the
same methods: register, authenticate, heartbeat, wait for an assignment, report, upload logs
and outputs; and the lost sweep, which a coordinator task runs.
"""

from __future__ import annotations

import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable, Iterable, Sequence
from datetime import datetime, timedelta

from corral.controller._assignment_polls import AssignmentPolls, UnknownAgentError
from corral.controller._group_commit import GroupCommit
from corral.controller._outage_grace import OutageGrace
from corral.coordination.hints import PROMOTION_HINTS, Hint, hints_after_report
from corral.domain.record import record
from corral.domain.slots import ResourceSlots
from corral.domain.status import KernelStatus
from corral.domain.types import AgentId, Clock, KernelId, SessionId, utcnow
from corral.infra.hints import HintBus
from corral.store.agent_registry import (
    AgentRecord,
    LostAgents,
    mark_lost_agents,
    read_agent,
    record_heartbeats,
    register_agent,
)
from corral.store.agents import AGENT_ALIVE, NewAgent
from corral.store.assignments import Assignment
from corral.store.database import Database
from corral.store.kernel_checks import KernelChecks, check_quiet_kernels
from corral.store.kernel_logs import (
    DEFAULT_LOG_CAP_BYTES,
    LogChunk,
    OutputBlob,
    append_log_chunks,
    store_outputs,
)
from corral.store.kernel_reports import KernelReport, ReportOutcome, apply_report_batches
from corral.store.sweep_outlook import SweepOutlook, read_sweep_outlook
from corral.store.uploads import kernel_upload
from corral.store.users import hash_secret

logger = logging.getLogger(__name__)

__all__ = [
    "AgentAuthError",
    "AgentController",
    "AgentIdTakenError",
    "AgentTimings",
    "Registration",
    "Sweep",
    "UnknownAgentError",
]


class AgentAuthError(PermissionError):
    """The caller's token does not open this door (HTTP 401)."""


class AgentIdTakenError(ValueError):
    """A join-token registration named an agent id that already exists (HTTP 409)."""


# Promotes the sessions whose kernels a committed report batch moved, given as (session,
# kernel status before, after): `SessionCoordinator.promote_reported`.
PromoteReported = Callable[
    [Iterable[tuple[SessionId, KernelStatus, KernelStatus]]], Awaitable[object]
]


@record
class AgentTimings:
    """How long agents may stay silent, how often they should speak, how long a poll waits."""

    heartbeat_timeout_s: float = 30.0
    assignment_wait_s: float = 30.0
    # How often waiting long-polls re-read their revisions when no hint arrives (another
    # manager may have changed them; hints are per bus, not per agent).
    poll_recheck_s: float = 2.0
    # How long a started kernel's agent may say nothing of it before the manager asks (the
    # agent answers at its next assignment); unanswered for `heartbeat_timeout_s` after
    # that, the kernel fails with agent_lost (`store.kernel_checks`).
    running_quiet_s: float = 600.0
    terminating_quiet_s: float = 60.0  # post-run stages: logs, outputs; seconds, normally

    @property
    def heartbeat_interval_s(self) -> float:
        """A third of the timeout: two heartbeats may be lost before the agent is."""
        return self.heartbeat_timeout_s / 3


@record
class Sweep:
    """What one sweep changed, and when it next could have work (seconds from now)."""

    lost: LostAgents
    checks: KernelChecks
    due_in_s: float


@record
class Registration:
    """What registering told the agent."""

    agent_id: AgentId
    token: str | None  # a new token, shown once
    created: bool


class AgentController:
    """Registers agents, checks their tokens, serves their assignments, takes their reports."""

    def __init__(
        self,
        db: Database,
        hints: HintBus,
        *,
        join_token: str | None,
        timings: AgentTimings = AgentTimings(),
        clock: Clock = utcnow,
        promote: PromoteReported | None = None,
        log_cap_bytes: int | None = DEFAULT_LOG_CAP_BYTES,
    ) -> None:
        self.db = db
        self.log_cap_bytes = log_cap_bytes  # per kernel and stream (None: no cap)
        self.hints = hints
        self.timings = timings
        self.clock = clock
        self._join_token = join_token
        self._promote = promote
        self.polls = AssignmentPolls(db, hints, timings.poll_recheck_s)
        self._grace = OutageGrace(db, timings.heartbeat_timeout_s)
        self._reports: GroupCommit[tuple[AgentId, Sequence[KernelReport]], ReportOutcome] = (
            GroupCommit(self._apply_reports, then=self._after_reports)
        )
        self._heartbeats: GroupCommit[AgentId, str] = GroupCommit(self._record_heartbeats)

    async def register(
        self,
        bearer: str,
        agent_id: AgentId,
        *,
        address: str,
        slots: ResourceSlots,
        resource_group: str = "default",
        labels: dict[str, str] | None = None,
        runtime: str = "process",
    ) -> Registration:
        """Join with the join token (a new agent gets its own token) or come back with its own."""
        known = await read_agent(self.db, agent_id)
        own = known is not None and _matches(bearer, known.token_hash)
        if not own:
            if not self._join_token or not hmac.compare_digest(
                bearer.encode(), self._join_token.encode()
            ):
                raise AgentAuthError(
                    "registering needs the manager's join token, or the agent's own token "
                    "to come back under the same id"
                )
            if known is not None and self._alive(known):
                raise AgentIdTakenError(
                    f"agent id {agent_id!r} is registered and alive; present that agent's token "
                    "(kept in its data directory), choose another id, or wait until the "
                    "manager declares it lost"
                )
        token = None if own else secrets.token_urlsafe(32)
        created = await register_agent(
            self.db,
            NewAgent(
                id=agent_id,
                address=address,
                capacity=slots.to_milli(),
                resource_group=resource_group,
                runtime=runtime,
                labels=labels or {},
                token_hash=hash_secret(token) if token else None,
            ),
            self.clock(),
        )
        logger.info(
            "agent.registered",
            extra={"agent_id": agent_id, "new": created, "group": resource_group},
        )
        # New capacity: pending sessions may fit now.
        await self.hints.set_after_commit(Hint.SCHEDULE.value, Hint.ASSIGNMENTS.value)
        return Registration(agent_id, token, created)

    def _alive(self, agent: AgentRecord) -> bool:
        """ALIVE and heard from within the timeout: its id cannot be taken over."""
        if agent.status != AGENT_ALIVE or agent.last_heartbeat_at is None:
            return False
        silent = self.clock() - agent.last_heartbeat_at
        return silent < timedelta(seconds=self.timings.heartbeat_timeout_s)

    async def authenticate(self, agent_id: AgentId, bearer: str) -> AgentRecord:
        """The agent, if `bearer` is its token; else AgentAuthError (or UnknownAgentError)."""
        known = await read_agent(self.db, agent_id)
        if known is None:
            raise UnknownAgentError(f"no agent {agent_id!r} is registered")
        if not _matches(bearer, known.token_hash):
            raise AgentAuthError(f"the token is not agent {agent_id!r}'s")
        return known

    async def heartbeat(self, agent_id: AgentId) -> str:
        """Note the agent alive; its status (LOST means: register again)."""
        return await self._heartbeats.submit(agent_id)

    async def assignment(self, agent_id: AgentId, since: int | None, wait_s: float) -> Assignment:
        """The agent's desired state: at once if its revision is not `since`, else when it
        moves or after `wait_s`. Needs `polls.run()` running (the manager runs it)."""
        return await self.polls.get(agent_id, since, wait_s if since is not None else 0.0)

    async def report(self, agent_id: AgentId, reports: Sequence[KernelReport]) -> ReportOutcome:
        """Apply a batch of kernel reports, each as far as it is legal (the outcome names the
        refused ones), and wake the phases they concern.

        Batches of agents reporting at the same time share one transaction (group commit).
        """
        outcome = await self._reports.submit((agent_id, reports))
        if outcome.refused:
            logger.warning(
                "agent.reports_refused",
                extra={
                    "agent_id": agent_id,
                    "refused": {str(k): why for k, why in outcome.refused.items()},
                },
            )
        return outcome

    async def upload_logs(self, agent_id: AgentId, chunks: Sequence[LogChunk]) -> None:
        """Store log chunks of the agent's kernels (idempotent), each stream within the cap."""
        await append_log_chunks(
            self.db, agent_id, chunks, self.clock(), cap_bytes=self.log_cap_bytes
        )

    async def upload_outputs(self, agent_id: AgentId, outputs: Sequence[OutputBlob]) -> None:
        """Store output files of the agent's kernels (idempotent)."""
        await store_outputs(self.db, agent_id, outputs, self.clock())

    async def kernel_upload(self, agent_id: AgentId, kernel_id: KernelId) -> bytes | None:
        """The upload a kernel placed on the agent unpacks; None: no such kernel or upload."""
        return await kernel_upload(self.db, agent_id, kernel_id)

    async def sweep(self) -> Sweep:
        """The lost sweep and the kernel checks, each only when one read (`store.sweep_outlook`)
        says it has work now; and when either next could (`Sweep.due_in_s`).

        The moment is the earliest of: the oldest ALIVE agent's heartbeat plus the timeout (a
        heartbeat from now, where no agent is ALIVE: one joining now is lost then at the
        earliest), held back to the end of an outage's grace; every started kernel's quiet
        moment plus its bound, and that of a kernel starting now; the oldest unanswered ask
        plus the timeout. The coordinator's loop runs the sweep then, and every long interval.
        """
        now = self.clock()
        try:
            outlook = await read_sweep_outlook(self.db)
        except Exception as exc:
            self._grace.failed(exc)
            raise
        self._grace.answered(now)
        timeout = timedelta(seconds=self.timings.heartbeat_timeout_s)
        lost_at = (outlook.oldest_heartbeat or now) + timeout
        if self._grace.until is not None:
            lost_at = max(lost_at, self._grace.until)
        kernels_at = self._quiet_moment(outlook, now)
        lost = LostAgents()
        if outlook.oldest_heartbeat is not None and lost_at <= now:
            lost = await self.sweep_lost()
        checks = KernelChecks()
        if kernels_at <= now:
            checks = await self.check_kernels()
        due_in_s = (min(lost_at, kernels_at) - now).total_seconds()
        if lost.agent_ids or checks.asked or checks.failed:
            due_in_s = 0.0  # rows moved: look again at them at once
        elif due_in_s <= 0:
            due_in_s = self.timings.heartbeat_interval_s  # the estimate came early
        return Sweep(lost, checks, due_in_s)

    def _quiet_moment(self, outlook: SweepOutlook, now: datetime) -> datetime:
        """The earliest moment a started kernel may need asking about, or failing."""
        bounds = self._quiet_bounds()
        at = now + min(bounds.values())  # a kernel that starts now
        for status, quiet in outlook.unasked.items():
            at = min(at, max(quiet.changed, quiet.heard) + bounds[status])
        if outlook.oldest_ask is not None:
            at = min(at, outlook.oldest_ask + timedelta(seconds=self.timings.heartbeat_timeout_s))
        return at

    def _quiet_bounds(self) -> dict[KernelStatus, timedelta]:
        """How long each checked status may go without word of a kernel before it is asked."""
        return {
            KernelStatus.RUNNING: timedelta(seconds=self.timings.running_quiet_s),
            KernelStatus.TERMINATING: timedelta(seconds=self.timings.terminating_quiet_s),
        }

    async def sweep_lost(self) -> LostAgents:
        """Mark agents silent past the timeout LOST and fail their kernels (`agent_lost`);
        none within a timeout of a database outage (`_outage_grace`)."""
        now = self.clock()
        cutoff = now - timedelta(seconds=self.timings.heartbeat_timeout_s)
        lost = await self._grace.run(
            now, lambda: mark_lost_agents(self.db, cutoff, now), LostAgents
        )
        if lost.agent_ids:
            logger.warning(
                "agent.lost",
                extra={
                    "agents": lost.agent_ids,
                    "kernels": len(lost.kernels),
                    "sessions_to_place_again": len(lost.unstarted),
                },
            )
            hints = hints_after_report({KernelStatus.ERROR}) if lost.kernels else set()
            if lost.unstarted:  # their phases' handlers count the failed attempt
                hints |= {Hint.PREPARE, Hint.START, Hint.TERMINATE}
            await self.hints.set_after_commit(*sorted(h.value for h in hints | {Hint.ASSIGNMENTS}))
        return lost

    async def check_kernels(self) -> KernelChecks:
        """Ask agents about the started kernels they have been quiet about past their
        status's bound; fail with agent_lost those asked about that stayed unanswered."""
        now = self.clock()
        quiet_since = {status: now - bound for status, bound in self._quiet_bounds().items()}
        asked_before = now - timedelta(seconds=self.timings.heartbeat_timeout_s)
        checks = await check_quiet_kernels(self.db, quiet_since, asked_before, now)
        if checks.asked or checks.failed:
            logger.warning(
                "agent.kernels_checked",
                extra={
                    "asked": {str(k): a for k, a in checks.asked.items()},
                    "failed": sorted(str(k) for k in checks.failed),
                },
            )
            hints = hints_after_report({KernelStatus.ERROR}) if checks.failed else set()
            await self.hints.set_after_commit(*sorted(h.value for h in hints | {Hint.ASSIGNMENTS}))
        return checks

    async def _apply_reports(
        self, batches: Sequence[tuple[AgentId, Sequence[KernelReport]]]
    ) -> list[ReportOutcome]:
        return await apply_report_batches(self.db, batches, self.clock())

    async def _after_reports(self, outcomes: Sequence[ReportOutcome]) -> None:
        # While the next batch is being applied (`GroupCommit`'s `then`).
        await after_reports(self.hints, outcomes, self._promote)

    async def _record_heartbeats(
        self, agent_ids: Sequence[AgentId]
    ) -> list[str | UnknownAgentError]:
        statuses = await record_heartbeats(self.db, agent_ids, self.clock())
        return [
            statuses.get(a) or UnknownAgentError(f"no agent {a!r} is registered") for a in agent_ids
        ]


async def after_reports(
    hints: HintBus, outcomes: Sequence[ReportOutcome], promote: PromoteReported | None
) -> None:
    """What follows committed report batches: promote the sessions they concern at once
    (with `promote`), and wake the tasks that come next.

    Once `promote` did its work the promotion tasks need no hint; if it failed, the reports
    stay applied and the tasks' hints are set instead, so the promotions come a run later.
    """
    moved: set[KernelStatus] = set()
    failed: list[KernelStatus] = []
    for outcome in outcomes:
        moved |= outcome.moved_to()
        failed.extend(outcome.stage_failures.values())
    wake = hints_after_report(moved, failed)
    if promote is not None and wake & PROMOTION_HINTS:
        try:
            await promote(move for outcome in outcomes for move in outcome.kernel_moves())
        except Exception:
            logger.exception("agent.reports.promotion_failed")
        else:
            wake -= PROMOTION_HINTS
    if wake:
        await hints.set_after_commit(*sorted(h.value for h in wake))


def _matches(bearer: str, token_hash: str | None) -> bool:
    return token_hash is not None and hmac.compare_digest(hash_secret(bearer), token_hash)
