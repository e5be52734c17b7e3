"""Chains of moves (`apply_chains`) on both backends: every move in the history, the session
rows written once, the guard of the first move, endings and their causes."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.lifecycle import IllegalTransitionError
from corral.domain.results import ResultNote
from corral.domain.status import SessionStatus
from corral.domain.types import SessionId
from corral.store.database import Database
from corral.store.status_changes import AppliedChanges, ChainedMoves, apply_chains
from corral.store.tables import session_history, sessions
from tests.integration._statements import recorded_statements
from tests.integration.store._factories import NOW, add_session_ids, add_user, update_sessions

S = SessionStatus
RAN_AND_ENDED = (
    ("PromoteToRunning", S.RUNNING),
    ("DetectTermination", S.TERMINATING),
    ("PromoteToTerminated", S.TERMINATED),
)


async def history(db: Database, sid: SessionId) -> list[tuple[Any, ...]]:
    """(phase, from, to, error code, message) of the session's history rows, oldest first."""
    h = session_history.c
    async with db.read() as conn:
        rows = await conn.execute(
            sa.select(h.phase, h.from_status, h.to_status, h.error_code, h.message)
            .where(h.session_id == sid)
            .order_by(h.id)
        )
        return [tuple(row) for row in rows]


async def row(db: Database, sid: SessionId) -> sa.RowMapping:
    """The session's row."""
    async with db.read() as conn:
        return (
            (await conn.execute(sa.select(sessions).where(sessions.c.id == sid))).mappings().one()
        )


async def sessions_in(db: Database, status: SessionStatus, count: int) -> list[SessionId]:
    """`count` fresh sessions put straight into `status`."""
    ids = await add_session_ids(db, await add_user(db), count)
    await update_sessions(db, ids, status=status.value)
    return ids


async def test_every_move_has_its_history_and_the_row_ends_where_the_chain_does(
    db: Database,
) -> None:
    """CREATING → RUNNING → TERMINATING → TERMINATED: three history rows, each from where the
    one before went; the row TERMINATED, started and ended now, with its result and exit
    code; each round reported as the moves it made, with the owner."""
    owner = await add_user(db)
    [sid] = await add_session_ids(db, owner, 1)
    await update_sessions(db, [sid], status=S.CREATING.value)
    rounds: list[dict[SessionId, tuple[SessionStatus, SessionStatus]]] = []

    async def on_step(_conn: AsyncConnection, applied: AppliedChanges) -> None:
        rounds.append(applied.moved())
        assert applied.owners == {sid: owner}

    chain = ChainedMoves([sid], frozenset({S.CREATING}), RAN_AND_ENDED, endings={sid: ("x", 7)})
    applied = await apply_chains(db, [chain], NOW, on_step=on_step)

    assert (
        [a.moved() for a in applied]
        == rounds
        == [
            {sid: (S.CREATING, S.RUNNING)},
            {sid: (S.RUNNING, S.TERMINATING)},
            {sid: (S.TERMINATING, S.TERMINATED)},
        ]
    )
    assert await history(db, sid) == [
        ("PromoteToRunning", "CREATING", "RUNNING", None, ""),
        ("DetectTermination", "RUNNING", "TERMINATING", None, ""),
        ("PromoteToTerminated", "TERMINATING", "TERMINATED", None, ""),
    ]
    found = await row(db, sid)
    assert found["status"] == "TERMINATED"
    assert (found["result"], found["exit_code"]) == ("x", 7)
    stamps = (found["started_at"], found["terminated_at"], found["status_changed_at"])
    assert all(
        stamp is not None and stamp.replace(tzinfo=None) == NOW.replace(tzinfo=None)
        for stamp in stamps
    )


async def test_a_session_that_moved_meanwhile_is_left_alone(db: Database) -> None:
    """Only sessions in the first move's expected status are moved; the others are stale in
    the first round and untouched, and no later round names them."""
    [moving] = await sessions_in(db, S.CREATING, 1)
    [moved] = await sessions_in(db, S.RUNNING, 1)
    chain = ChainedMoves([moving, moved], frozenset({S.CREATING}), RAN_AND_ENDED[:2])
    first, second = await apply_chains(db, [chain], NOW)
    assert first.stale == {moved} and second.stale == set()
    assert first.moved() == {moving: (S.CREATING, S.RUNNING)}
    assert second.moved() == {moving: (S.RUNNING, S.TERMINATING)}
    assert (await row(db, moving))["status"] == "TERMINATING"
    untouched = await row(db, moved)
    assert untouched["status"] == "RUNNING" and untouched["started_at"] is None
    assert await history(db, moved) == []


async def test_an_ending_with_a_cause_notes_it_on_the_row_and_the_last_history_row(
    db: Database,
) -> None:
    """A failure before running: TERMINATING, then ERROR with the kernel's cause, on the
    session (failure cause, status info) and on the ending's history row only; never started."""
    [sid] = await sessions_in(db, S.PREPARING, 1)
    note = ResultNote("oom_killed", "kernel 0 failed: oom_killed")
    chain = ChainedMoves(
        [sid],
        frozenset({S.SCHEDULED, S.PREPARING}),
        (("DetectFailureBeforeRunning", S.TERMINATING), ("PromoteToTerminated", S.ERROR)),
        notes={sid: note},
        endings={sid: ("failure", None)},
    )
    await apply_chains(db, [chain], NOW)
    assert await history(db, sid) == [
        ("DetectFailureBeforeRunning", "PREPARING", "TERMINATING", None, ""),
        ("PromoteToTerminated", "TERMINATING", "ERROR", "oom_killed", note.message),
    ]
    found = await row(db, sid)
    assert (found["status"], found["failure_cause"], found["status_info"]) == (
        "ERROR",
        "oom_killed",
        note.message,
    )
    assert (found["result"], found["exit_code"], found["started_at"]) == ("failure", None, None)
    assert found["terminated_at"] is not None


async def test_sessions_of_one_chain_keep_their_own_endings(db: Database) -> None:
    """Sessions moved alike but ending differently each get their own result and exit code;
    sessions of another chain get theirs."""
    a, b, c = await sessions_in(db, S.CREATING, 3)
    [d] = await sessions_in(db, S.PREPARING, 1)
    ended = ChainedMoves(
        [a, b, c],
        frozenset({S.CREATING}),
        RAN_AND_ENDED,
        endings={a: ("success", 0), b: ("failure", 3), c: ("success", 0)},
    )
    prepared = ChainedMoves([d], frozenset({S.PREPARING}), (("PromoteToPrepared", S.PREPARED),))
    first, *_ = await apply_chains(db, [ended, prepared], NOW)
    assert first.moved()[d] == (S.PREPARING, S.PREPARED)
    ends = {
        sid: ((r := await row(db, sid))["status"], r["result"], r["exit_code"])
        for sid in (a, b, c, d)
    }
    assert ends == {
        a: ("TERMINATED", "success", 0),
        b: ("TERMINATED", "failure", 3),
        c: ("TERMINATED", "success", 0),
        d: ("PREPARED", None, None),
    }
    assert (await row(db, d))["started_at"] is None


async def test_chains_that_move_alike_share_the_statements_of_those_moves(db: Database) -> None:
    """A run that ended well and one that failed went RUNNING and TERMINATING alike: those
    moves get one history statement for both chains, each session still its own rows in
    order; the endings differ, and the failed one carries its cause."""
    ok, bad = await sessions_in(db, S.CREATING, 2)
    failed = (*RAN_AND_ENDED[:2], ("PromoteToTerminated", S.ERROR))
    cause = ResultNote("kernel_nonzero_exit", "kernel 0 exited with 1")
    chains = [
        ChainedMoves([ok], frozenset({S.CREATING}), RAN_AND_ENDED, endings={ok: ("success", 0)}),
        ChainedMoves(
            [bad],
            frozenset({S.CREATING}),
            failed,
            notes={bad: cause},
            endings={bad: ("failure", 1)},
        ),
    ]
    with recorded_statements(db) as statements:
        await apply_chains(db, chains, NOW)
    inserts = [s for s in statements if s.startswith("INSERT INTO session_scheduling_history")]
    assert len(inserts) == 4  # RUNNING, TERMINATING, then TERMINATED and ERROR
    assert [h[1:3] for h in await history(db, ok)] == [
        ("CREATING", "RUNNING"),
        ("RUNNING", "TERMINATING"),
        ("TERMINATING", "TERMINATED"),
    ]
    assert await history(db, bad) == [
        ("PromoteToRunning", "CREATING", "RUNNING", None, ""),
        ("DetectTermination", "RUNNING", "TERMINATING", None, ""),
        ("PromoteToTerminated", "TERMINATING", "ERROR", cause.code, cause.message),
    ]
    ok_row, bad_row = await row(db, ok), await row(db, bad)
    assert (ok_row["status"], ok_row["result"], ok_row["exit_code"]) == ("TERMINATED", "success", 0)
    assert (bad_row["status"], bad_row["result"], bad_row["exit_code"]) == ("ERROR", "failure", 1)
    assert (ok_row["failure_cause"], bad_row["failure_cause"]) == (None, cause.code)
    assert ok_row["started_at"] == bad_row["started_at"] == NOW


async def test_an_illegal_chain_raises_before_anything_is_written(db: Database) -> None:
    """A later move the session table forbids fails the whole call before any write; so does
    a chain without moves."""
    [sid] = await sessions_in(db, S.CREATING, 1)
    illegal = ChainedMoves(
        [sid], frozenset({S.CREATING}), (("PromoteToRunning", S.RUNNING), ("bogus", S.PREPARED))
    )
    with pytest.raises(IllegalTransitionError, match="RUNNING → PREPARED"):
        await apply_chains(db, [illegal], NOW)
    with pytest.raises(ValueError, match="at least one move"):
        await apply_chains(db, [ChainedMoves([sid], frozenset({S.CREATING}), ())], NOW)
    assert (await row(db, sid))["status"] == "CREATING"
    assert await history(db, sid) == []


async def test_no_session_opens_nothing(db: Database) -> None:
    """Chains naming no session write nothing and report empty rounds."""
    applied = await apply_chains(
        db, [ChainedMoves([], frozenset({S.CREATING}), RAN_AND_ENDED)], NOW
    )
    assert [a.sessions for a in applied] == [{}, {}, {}]
    assert SessionId(uuid.uuid4()) not in applied[0].stale
