"""Poison isolation: one session no code path can handle never stops a loop or a route for
anyone else.

A scheduling pass, a listing, an agent's assignment, a promotion or the event stream that
meets a row it cannot handle (slots too large for the placement arrays, text that cannot be
encoded, a spec that does not parse) hands the row's session here and goes on with the rest.
The session is failed at once: ERROR with the cause `invalid_request` (`domain.outcome`), its
kernels ERROR and their slots given back, and a `session.status_changed` event saying why,
all in one transaction. Input validation keeps such rows out today; they come from versions
that let them in, or from a bug. A row that cannot even be failed (an event, a session that
ended) is skipped, and logged once per row and place, not at every read.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Mapping

from sqlalchemy.ext.asyncio import AsyncConnection

from corral.coordination.hints import Hint
from corral.domain.events import Event
from corral.domain.outcome import INVALID_REQUEST
from corral.domain.results import ResultNote, SchedulingResult, TransitionStatus
from corral.domain.status import SESSION_NON_TERMINAL, KernelStatus, SessionStatus
from corral.domain.types import Clock, SessionId, utcnow
from corral.infra.events import EventBus, publish_appended
from corral.infra.hints import HintBus
from corral.store.database import Database
from corral.store.events import append_session_moves
from corral.store.status_changes import AppliedChanges, StatusChange, apply_changes

logger = logging.getLogger(__name__)

PHASE = "isolate"  # the history phase of the move
_REMEMBERED = 10_000  # rows logged as skipped, kept to log each once (oldest forgotten first)


class Quarantine:
    """Fails sessions whose rows cannot be handled, and logs rows skipped, each once."""

    def __init__(
        self,
        db: Database,
        hints: HintBus | None = None,
        events: EventBus | None = None,
        *,
        clock: Clock = utcnow,
    ) -> None:
        self.db = db
        self.hints = hints
        self.events = events
        self.clock = clock
        self._notify = events.commit_channel if events is not None else None
        self._logged: OrderedDict[tuple[str, str], None] = OrderedDict()

    async def isolate(self, reasons: Mapping[SessionId, str], *, where: str) -> set[SessionId]:
        """Fail each session (`reasons`: why it cannot be handled); the ones failed now.

        A session that already ended is left as it is (and not returned): skip it.
        """
        if not reasons:
            return set()
        now = self.clock()
        note = {sid: ResultNote(INVALID_REQUEST, f"{where}: {why}") for sid, why in reasons.items()}
        change = StatusChange(
            list(reasons),
            PHASE,
            SchedulingResult.GIVE_UP,
            SESSION_NON_TERMINAL,
            TransitionStatus(SessionStatus.ERROR, KernelStatus.ERROR),
            notes=note,
        )
        appended: list[Event] = []

        async def record(conn: AsyncConnection, applied: AppliedChanges) -> None:
            moves = applied.moved()
            why = {sid: note[sid].message for sid in moves}
            appended.extend(
                await append_session_moves(
                    conn,
                    self.db.dialect,
                    moves,
                    why,
                    now,
                    owners=applied.owners,
                    notify=self._notify,
                )
            )

        applied = await apply_changes(self.db, [change], now, on_applied=record)
        failed = set(applied.moved())
        for sid in failed:
            logger.error(
                "quarantine.session_failed",
                extra={"session_id": str(sid), "where": where, "reason": reasons[sid]},
            )
        if failed and self.hints is not None:
            await self.hints.set_after_commit(Hint.SCHEDULE)  # their slots are free again
        await publish_appended(self.events, appended)
        return failed

    def skipped(self, where: str, key: object, error: BaseException | str) -> None:
        """Log that the row `key` was left out at `where` because of `error`, once."""
        mark = (where, str(key))
        if mark in self._logged:
            return
        self._logged[mark] = None
        if len(self._logged) > _REMEMBERED:
            self._logged.popitem(last=False)
        logger.error(
            "quarantine.row_skipped",
            extra={"where": where, "row": str(key), "error": str(error)[:500]},
        )
