"""Agents' assignment long-polls, answered in batches.

Every waiting poll is parked here. One task per manager serves them all: whenever a poll
arrives, the ASSIGNMENTS hint is set, or `recheck_s` passes (a hint's notification from
another manager may have been lost; hints are per bus, not per agent), it reads the revisions
of every parked agent in one query and the assignments of those due (revision moved, first
poll, wait over) in three more, whatever their number. On a bus that loses no hint (the
in-process one, `HintBus.lossless`), the recheck comes every `LOSSLESS_RECHECK_S` instead, as a
dual loop's forced run does: an idle manager reads nothing every two seconds.

A database outage ends no poll and stops nothing: a batch that fails to read is tried again
after a backoff (the outage logged once), and polls whose wait ran out meanwhile are answered
503, so their agents poll again (here, or at another manager).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from corral.coordination.hints import Hint
from corral.domain.types import AgentId
from corral.infra._backoff import reconnect_delays
from corral.infra._outage import OutageLog
from corral.infra.hints import HintBus, HintBusError
from corral.store.assignments import Assignment, read_assignments, read_revisions
from corral.store.database import Database
from corral.store.unavailable import database_unavailable

logger = logging.getLogger(__name__)

# Backoff between batches while the database is down: short, so service resumes within about
# two seconds of its return (issue 32's target), and capped so an outage costs few attempts.
RETRY_BASE_S = 0.1
RETRY_CAP_S = 2.0
_CANCEL_RETRY_S = 0.1
# The recheck on a lossless hint bus: a safety net only (the dual loops' long interval).
LOSSLESS_RECHECK_S = 60.0


class UnknownAgentError(LookupError):
    """No agent has this id (HTTP 404)."""


class PollsClosedError(RuntimeError):
    """The manager is stopping: the agent should poll again, here or at another manager."""


class AssignmentsUnavailableError(RuntimeError):
    """The database cannot be read now: the agent should poll again, here or elsewhere."""


@dataclass(eq=False, slots=True)
class _Poll:
    since: int | None  # None: answer at once
    deadline: float  # loop time after which it is answered whatever the revision
    future: asyncio.Future[Assignment]
    checked: bool = False  # its revision was compared once; later only a hint re-checks it


class AssignmentPolls:
    """Parks long-polls and answers them in batches (see the module docstring)."""

    def __init__(self, db: Database, hints: HintBus, recheck_s: float) -> None:
        self._db = db
        self._hints = hints
        self._recheck_s = recheck_s
        self._parked: dict[AgentId, list[_Poll]] = {}
        self._wake = asyncio.Event()
        self._recheck = True  # a hint (or the recheck interval) asks to compare every poll
        self._closed = False

    async def get(self, agent_id: AgentId, since: int | None, wait_s: float) -> Assignment:
        """The agent's assignment once its revision is not `since` or `wait_s` passed."""
        if self._closed:
            raise PollsClosedError("the manager is stopping; poll again")
        loop = asyncio.get_running_loop()
        poll = _Poll(since, loop.time() + max(wait_s, 0.0), loop.create_future())
        self._parked.setdefault(agent_id, []).append(poll)
        self._wake.set()
        try:
            return await poll.future
        finally:
            self._unpark(agent_id, poll)

    def waiting(self, agent_id: AgentId) -> int:
        """How many long-polls of this agent are parked now."""
        return len(self._parked.get(agent_id, ()))

    def close(self) -> None:
        """The manager is stopping: every parked poll (and any later one) is told so now."""
        self._closed = True
        self._wake.set()  # run() returns
        for polls in self._parked.values():
            for poll in polls:
                if not poll.future.done():
                    poll.future.set_exception(PollsClosedError("the manager is stopping"))

    async def run(self) -> None:
        """Serve polls until close() (or cancelled); a database outage is waited out, a bug
        raised.

        close() ends the loop even if a cancellation was lost: on Python 3.11, `wait_for`
        (here and inside the database driver) swallows a cancel that lands as it completes.
        """
        listener = asyncio.create_task(self._listen(), name="assignment-polls-hints")
        outage = OutageLog(
            logger, "agent.assignment_polls_database_unavailable", "agent.assignment_polls_resumed"
        )
        delays = reconnect_delays(RETRY_BASE_S, RETRY_CAP_S)
        try:
            while not self._closed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self._until_next_deadline())
                self._wake.clear()
                if self._closed:
                    return
                try:
                    await self.serve()
                except Exception as exc:
                    if not database_unavailable(exc):
                        raise  # a bug: the manager stops, loudly
                    outage.failure({"error": type(exc).__name__})
                    self._recheck = True  # the failed batch's comparisons are owed
                    self._answer_expired(AssignmentsUnavailableError("the database is down"))
                    await asyncio.sleep(next(delays))
                    self._wake.set()
                    continue
                if outage.down:
                    outage.success()
                    delays = reconnect_delays(RETRY_BASE_S, RETRY_CAP_S)
        finally:
            # Cancelled again until it ends: a cancel can be lost (see above).
            while not listener.done():
                listener.cancel()
                await asyncio.wait({listener}, timeout=_CANCEL_RETRY_S)

    async def serve(self) -> None:
        """Answer every parked poll that is due, in one batch.

        Revisions are read for every parked poll after a hint or the recheck interval, and
        otherwise only for polls that arrived since the last batch: a revision that moved
        since then has set the hint.
        """
        if not self._parked:
            return
        recheck, self._recheck = self._recheck, False
        now = asyncio.get_running_loop().time()
        looked_at = [
            agent_id
            for agent_id, polls in self._parked.items()
            if recheck or any(not p.checked or p.deadline <= now for p in polls)
        ]
        revisions = await read_revisions(self._db, looked_at) if looked_at else {}
        due: dict[AgentId, list[_Poll]] = {}
        for agent_id in looked_at:
            revision = revisions.get(agent_id)
            for poll in self._parked.get(agent_id, ()):
                if poll.future.done():
                    continue
                poll.checked = True
                if revision is None or poll.since != revision or poll.deadline <= now:
                    due.setdefault(agent_id, []).append(poll)
        if not due:
            return
        found = await read_assignments(self._db, list(due))
        for agent_id, polls in due.items():
            assignment = found.get(agent_id)
            for poll in polls:
                if poll.future.done():
                    continue
                if assignment is None:
                    poll.future.set_exception(
                        UnknownAgentError(f"no agent {agent_id!r} is registered")
                    )
                else:
                    poll.future.set_result(assignment)

    async def _listen(self) -> None:
        """Wake the server on the ASSIGNMENTS hint, and every recheck interval regardless.

        While the hint bus is down, every `recheck_s` only: the agents' assignments come that
        much later, never not at all.
        """
        outage = OutageLog(
            logger, "agent.assignment_hints_unavailable", "agent.assignment_hints_restored"
        )
        recheck_s = max(self._recheck_s, LOSSLESS_RECHECK_S if self._hints.lossless else 0.0)
        while True:
            try:
                await self._hints.wait([Hint.ASSIGNMENTS.value], recheck_s)
                await self._hints.consume(Hint.ASSIGNMENTS.value)
            except HintBusError as exc:
                outage.failure({"error": str(exc)})
                await asyncio.sleep(self._recheck_s)
            else:
                outage.success()
            self._recheck = True
            if self._parked:
                self._wake.set()

    def _answer_expired(self, error: Exception) -> None:
        """Fail the polls whose wait ran out (their agents' requests would time out)."""
        now = asyncio.get_running_loop().time()
        for polls in self._parked.values():
            for poll in polls:
                if poll.deadline <= now and not poll.future.done():
                    poll.future.set_exception(error)

    def _until_next_deadline(self) -> float | None:
        deadlines = [p.deadline for polls in self._parked.values() for p in polls]
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - asyncio.get_running_loop().time())

    def _unpark(self, agent_id: AgentId, poll: _Poll) -> None:
        polls = self._parked.get(agent_id)
        if polls is None:
            return
        with contextlib.suppress(ValueError):
            polls.remove(poll)
        if not polls:
            del self._parked[agent_id]
