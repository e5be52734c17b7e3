"""`GET /v1/sessions/{id}/logs`: a session's output, its tail, since a time, or followed live.

The work is done here, on the manager, so a client receives only what it shows: `tail=5` of a
10 MiB log reads the last chunk or two (`store/log_reading.py`). Every kernel's output by
default, each line prefixed `[kernel N] ` when the session has several; one kernel (the only
one, or the one asked for) without timestamps is passed through byte for byte (what `corral
run` copies to its stdout).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import PlainTextResponse, StreamingResponse

from corral.api._closing import until_closing
from corral.api._pages import MAX_BIGINT
from corral.api.auth import CurrentUser, Db
from corral.api.problems import Problem
from corral.api.sessions import SessionRef, _visible
from corral.domain.log_text import LineFormatter, LogLine, dropped_note, merge_by_time
from corral.domain.moments import parse_moment
from corral.domain.status import SESSION_TERMINAL, SessionStatus
from corral.domain.types import KernelId, utcnow
from corral.store.database import Database
from corral.store.log_reading import LogRead, read_log_from, read_log_tail
from corral.store.session_views import session_status

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])

FOLLOW_POLL_S = 0.5  # how often a followed log is read again while the session runs
MAX_TAIL = 1_000_000
TEXT = "text/plain; charset=utf-8"


class _Shown:
    """One kernel's stream as shown: where it was read to, and its line formatter."""

    def __init__(self, kernel_id: KernelId, formatter: LineFormatter) -> None:
        self.kernel_id = kernel_id
        self.formatter = formatter
        self.position = 0

    def lines(self, read: LogRead) -> list[LogLine]:
        """The formatted lines of a read (after the dropped note, if it skipped any)."""
        out: list[LogLine] = []
        if read.skipped:
            at = read.pieces[0].stored_at if read.pieces else utcnow()
            out.append(self.formatter.note(dropped_note(read.skipped), at))
        out += self.formatter.feed(read.pieces)
        self.position = read.end
        return out


@router.get("/{session_id}/logs", response_class=PlainTextResponse, operation_id="get_session_logs")
async def session_logs(
    request: Request,
    session_id: SessionRef,
    user: CurrentUser,
    db: Db,
    stream: Literal["stdout", "stderr"] = "stdout",
    kernel: Annotated[
        int | None, Query(ge=0, description="one kernel's cluster index (default: every kernel)")
    ] = None,
    offset: Annotated[
        int | None,
        Query(ge=0, le=MAX_BIGINT, description="one kernel's bytes from this offset on"),
    ] = None,
    tail: Annotated[
        int | None, Query(ge=0, le=MAX_TAIL, description="only the last N lines (per kernel)")
    ] = None,
    since: Annotated[
        str | None,
        Query(max_length=64, description="only output stored since: an age (10m) or ISO time"),
    ] = None,
    timestamps: Annotated[
        bool, Query(description="prefix each line with the time its output was stored")
    ] = False,
    follow: bool = False,
) -> Response:
    """The session's output so far; with `follow`, streamed on until the session ends (or the
    manager stops: then the session's status says whether it ended)."""
    found = await _visible(db, user, session_id)
    chosen = _kernels(found, kernel)
    if offset is not None and (tail is not None or since is not None):
        raise _invalid("offset", "give either offset, or tail and since, not both")
    if offset is not None and len(chosen) > 1:
        raise _invalid("offset", "an offset is one kernel's: give kernel as well")
    moment = _since(since)
    several = len(chosen) > 1  # one kernel shown, even of several, is shown as it wrote it
    shown = [
        _Shown(
            KernelId(k["id"]),
            LineFormatter(
                label=f"kernel {k['cluster_index']}" if several else None, timestamps=timestamps
            ),
        )
        for k in chosen
    ]

    async def first_reads() -> list[list[LogLine]]:
        outputs = []
        for one in shown:
            if offset is None and (tail is not None or moment is not None):
                read = await read_log_tail(db, one.kernel_id, stream, lines=tail, since=moment)
            else:
                read = await read_log_from(db, one.kernel_id, stream, offset or 0)
            outputs.append(one.lines(read))
        return outputs

    if not follow:
        outputs = await first_reads()
        for one, lines in zip(shown, outputs, strict=True):
            lines += one.formatter.finish()
        return Response(b"".join(merge_by_time(outputs)), media_type=TEXT)

    async def chunks() -> AsyncIterator[bytes]:
        # The status read with the session, before the log: nothing is missed. (A read of its
        # own here came while a just submitted session's agent waited for its answer.)
        ended = SessionStatus(found["status"]) in SESSION_TERMINAL
        outputs = await first_reads()
        while True:
            if ended:
                for one, lines in zip(shown, outputs, strict=True):
                    lines += one.formatter.finish()
            data = b"".join(merge_by_time(outputs))
            if data:
                yield data
            if ended:
                return
            await asyncio.sleep(FOLLOW_POLL_S)
            ended = await _ended(db, found["id"])
            outputs = [
                one.lines(await read_log_from(db, one.kernel_id, stream, one.position))
                for one in shown
            ]

    closing = request.app.state.context.closing
    return StreamingResponse(until_closing(chunks(), closing), media_type=TEXT)


def _kernels(found: Mapping[str, Any], index: int | None) -> Sequence[Mapping[str, Any]]:
    kernels = sorted(found["kernels"], key=lambda k: k["cluster_index"])
    if index is None:
        return kernels
    chosen = [k for k in kernels if k["cluster_index"] == index]
    if not chosen:
        raise Problem(
            404, "kernel-not-found", "No such kernel", f"the session has no kernel {index}"
        )
    return chosen


def _since(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return parse_moment(text, utcnow())
    except ValueError as exc:
        raise _invalid("since", str(exc)) from None


def _invalid(field: str, message: str) -> Problem:
    return Problem(
        422,
        "validation-error",
        "The request is not valid",
        f"{field}: {message}",
        errors=[{"field": field, "message": message}],
    )


async def _ended(db: Database, session_id: uuid.UUID) -> bool:
    status = await session_status(db, session_id)  # every poll of a follow: status only
    return status is None or SessionStatus(status) in SESSION_TERMINAL
