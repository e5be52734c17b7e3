"""A test agent: plays agents through the store operations the agent protocol uses.

It reads each agent's assignment (the kernels' desired state) and answers with kernel reports,
exactly as the agent daemon does over HTTP, but in-process and instantly: preparing goes
PREPARING → PULLING → PREPARED, starting CREATING → RUNNING, stopping ends the kernel. Knobs
make agents fail preparation or start, ignore their assignments, or let kernels exit at once;
`exit` and `crash` end running kernels on demand. Used by the lifecycle tests and
`corral bench latency`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from corral.controller.agents import PromoteReported, after_reports
from corral.coordination.hints import Hint
from corral.domain.failure_causes import FailureCause
from corral.domain.session import KernelIntent
from corral.domain.status import KernelStatus
from corral.domain.types import AgentId, Clock, KernelId, utcnow
from corral.infra.hints import HintBus, HintBusError
from corral.store.assignments import AssignedKernel, read_assignment, read_revisions
from corral.store.database import Database
from corral.store.kernel_reports import KernelReport, apply_kernel_reports

K = KernelStatus
STOPPED_EXIT_CODE = -15  # as if stopped by SIGTERM
_BEFORE_RUNNING = frozenset({K.SCHEDULED, K.PREPARING, K.PULLING, K.PREPARED, K.CREATING})


@dataclass
class TestAgent:
    """Instant agents for `agent_ids`, reporting through `apply_kernel_reports`."""

    __test__ = False  # not a pytest test class

    db: Database
    agent_ids: Collection[AgentId]
    hints: HintBus | None = None
    clock: Clock = utcnow
    # Kernels on these agents fail preparation (a stage failure the manager may retry).
    fail_prepare_on: set[AgentId] = field(default_factory=set)
    # Kernels on these agents fail to start.
    fail_start_on: set[AgentId] = field(default_factory=set)
    # These agents never act on their assignments (as if hung).
    unresponsive: set[AgentId] = field(default_factory=set)
    # The exit code a kernel ends with right after it started (None: it keeps running).
    exit_code: Callable[[AssignedKernel], int | None] = lambda kernel: None
    # Report a non-zero exit as the agent's kernel worker does: the kernel fails (ERROR) with
    # cause kernel_nonzero_exit and its exit code. False: it ends TERMINATED with the code.
    nonzero_exit_fails: bool = False
    # Where a started kernel reports it listens ("host", "port" in its runtime info, as the
    # process runtime reports a serving replica's); None: the agent's id as host, no port.
    address: Callable[[AssignedKernel], tuple[str, int] | None] = lambda kernel: None
    # Promotes the sessions a report concerns at once, as the manager's agent controller does
    # (`SessionCoordinator.promote_reported`); None leaves the promotions to their tasks.
    promote: PromoteReported | None = None
    reports: int = 0  # reports applied so far
    # The assignment revision each agent last reconciled.
    _seen: dict[AgentId, int] = field(default_factory=dict, repr=False)

    async def step(self) -> int:
        """Reconcile, side by side, every agent whose assignment changed since it last looked.

        As the agent daemon's long-poll does: one query for the revisions, then each agent
        whose revision moved reads its assignment and reports. Returns the reports applied.
        """
        revisions = await read_revisions(self.db, self.agent_ids)
        due = [
            agent_id
            for agent_id, revision in sorted(revisions.items())
            if agent_id not in self.unresponsive and self._seen.get(agent_id) != revision
        ]
        return sum(await asyncio.gather(*(self._step_one(agent_id) for agent_id in due)))

    async def exit(self, kernel_ids: Iterable[KernelId], exit_code: int = 0) -> None:
        """Running kernels exit with `exit_code`."""
        await self._end(kernel_ids, exit_code=exit_code)

    async def restart(
        self, kernel_ids: Iterable[KernelId], restarts: int, *, restarting: bool
    ) -> None:
        """Running kernels' `restarts`-th restart, as the agent's kernel worker reports it:
        under way (`restarting`: the process exited non-zero) or done (it runs again)."""
        wanted = set(kernel_ids)
        for agent_id in sorted(self.agent_ids):
            assignment = await read_assignment(self.db, agent_id)
            if assignment is None:
                continue
            batch = [
                KernelReport(
                    k.id,
                    K.RUNNING,
                    exit_code=1 if restarting else None,
                    failure_cause=FailureCause.KERNEL_NONZERO_EXIT if restarting else None,
                    restarts=restarts,
                    restarting=restarting,
                    attempt=k.attempt,
                )
                for k in assignment.kernels
                if k.id in wanted
            ]
            await self._report(agent_id, batch)

    async def crash(
        self, kernel_ids: Iterable[KernelId], cause: str = FailureCause.KERNEL_FAILED
    ) -> None:
        """Kernels fail (ERROR with `cause`) wherever they are."""
        await self._end(kernel_ids, failure_cause=cause)

    async def run(
        self,
        stop: asyncio.Event,
        *,
        interval_s: float = 1.0,
        on_step: Callable[[int, float], None] | None = None,
    ) -> None:
        """Step whenever the manager hints that assignments changed, until `stop` is set.

        `on_step(reports, elapsed_ms)` is told about every step (benchmarks time them).
        """
        if self.hints is None:
            raise ValueError("TestAgent.run needs a hint bus to wake on")
        while not stop.is_set():
            try:
                await self.hints.wait([Hint.ASSIGNMENTS.value], interval_s)
                await self.hints.consume(Hint.ASSIGNMENTS.value)
            except HintBusError:
                # The bus is down: step every interval, as a polling agent would.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), interval_s)
            started = time.perf_counter()
            reports = await self.step()
            if on_step is not None:
                on_step(reports, (time.perf_counter() - started) * 1000)

    async def _step_one(self, agent_id: AgentId) -> int:
        assignment = await read_assignment(self.db, agent_id)
        if assignment is None:
            return 0
        self._seen[agent_id] = assignment.revision
        reports = [r for k in assignment.kernels for r in self._reconcile(agent_id, k)]
        return await self._report(agent_id, reports)

    def _reconcile(self, agent_id: AgentId, kernel: AssignedKernel) -> list[KernelReport]:
        kid, status, intent = kernel.id, kernel.status, kernel.desired_state
        if intent is KernelIntent.STOP:
            if status in _BEFORE_RUNNING:
                return [KernelReport(kid, K.CANCELLED, message="stopped before it ran")]
            return [KernelReport(kid, K.TERMINATED, exit_code=STOPPED_EXIT_CODE)]
        if kernel.stage_failure is not None:
            return []  # reported; waiting for the manager to ask again
        if intent is KernelIntent.PREPARE and status in (K.PREPARING, K.PULLING):
            if agent_id in self.fail_prepare_on:
                return [_stage_failure(kid, status, FailureCause.IMAGE_PULL_FAILURE)]
            pulled = [] if status is K.PULLING else [KernelReport(kid, K.PULLING)]
            return [*pulled, KernelReport(kid, K.PREPARED)]
        if intent is KernelIntent.RUN and status is K.CREATING:
            if agent_id in self.fail_start_on:
                return [_stage_failure(kid, status, FailureCause.KERNEL_START_FAILURE)]
            address = self.address(kernel)
            info: dict[str, object] = {"host": str(agent_id)}
            if address is not None:
                info = {"host": address[0], "port": address[1]}
            started = [KernelReport(kid, K.RUNNING, runtime_info=info)]
            code = self.exit_code(kernel)
            if code is not None and code != 0 and self.nonzero_exit_fails:
                started.append(
                    KernelReport(
                        kid,
                        K.ERROR,
                        exit_code=code,
                        failure_cause=FailureCause.KERNEL_NONZERO_EXIT,
                        message=f"the kernel exited with code {code}",
                    )
                )
            elif code is not None:
                started.append(KernelReport(kid, K.TERMINATED, exit_code=code))
            return started
        return []

    async def _end(
        self,
        kernel_ids: Iterable[KernelId],
        *,
        exit_code: int | None = None,
        failure_cause: str | None = None,
    ) -> None:
        wanted = set(kernel_ids)
        for agent_id in sorted(self.agent_ids):
            assignment = await read_assignment(self.db, agent_id)
            if assignment is None:
                continue
            status = K.ERROR if failure_cause is not None else K.TERMINATED
            batch = [
                KernelReport(k.id, status, exit_code=exit_code, failure_cause=failure_cause)
                for k in assignment.kernels
                if k.id in wanted
            ]
            await self._report(agent_id, batch)

    async def _report(self, agent_id: AgentId, reports: list[KernelReport]) -> int:
        if not reports:
            return 0
        outcome = await apply_kernel_reports(self.db, agent_id, reports, self.clock())
        self.reports += len(reports)
        if self.hints is not None:
            await after_reports(self.hints, [outcome], self.promote)
        return len(reports)


def _stage_failure(kid: KernelId, status: KernelStatus, cause: str) -> KernelReport:
    return KernelReport(
        kid, status, failure_cause=cause, message=f"test agent: {cause}", stage_failed=True
    )
