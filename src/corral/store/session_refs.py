"""What a user types to name a session: its id, its number, a unique id prefix or its name.

Every API route that takes a session resolves it here, and the CLI sends what the user typed
to those routes, so a reference means the same everywhere. A reference is read as, in turn:

1. a full id (`0192f3a4-…`, with or without dashes);
2. a number (digits, no leading zero: `1234`);
3. a name: the one session of that name the caller can see (of a retry chain, the newest
   attempt);
4. an id prefix (hex digits and dashes: `0192f3a4-5b`): the one session whose id starts so.

The first reading that finds a session the caller can see wins; a name or prefix that fits
several is ambiguous (the candidates' numbers say which to type). Only the caller's own
sessions are searched, unless the caller is an admin: another user's number is "not found".
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence

import sqlalchemy as sa

from corral.domain.record import record
from corral.domain.retry.decide import RetryDecision
from corral.domain.types import UserId
from corral.store.database import Database
from corral.store.tables import sessions, users

AMBIGUOUS_SHOWN = 10  # candidates an ambiguous reference names
_NUMBER = re.compile(r"[1-9][0-9]{0,17}")  # within a BIGINT
_ID_PREFIX = re.compile(r"[0-9a-f-]+")
_ID_DIGITS = 32


class SessionRefError(LookupError):
    """A reference that names no session, or several."""


class SessionRefNotFoundError(SessionRefError):
    """No session the caller can see answers to the reference."""

    def __init__(self, ref: str) -> None:
        super().__init__(not_found_message(ref))
        self.ref = ref


def not_found_message(ref: str | uuid.UUID) -> str:
    """What a user is told when `ref` names no session they can see."""
    return f"no session you can see has the id, number or name {str(ref)!r}"


@record
class Candidate:
    """One of several sessions an ambiguous reference fits."""

    number: int
    id: uuid.UUID
    owner: str


class AmbiguousSessionRefError(SessionRefError):
    """A name or id prefix that fits several sessions; `candidates` (by number) say which."""

    def __init__(self, ref: str, kind: str, candidates: Sequence[Candidate]) -> None:
        shown = ", ".join(str(c.number) for c in candidates[:AMBIGUOUS_SHOWN])
        more = ", ..." if len(candidates) > AMBIGUOUS_SHOWN else ""
        super().__init__(
            f"{kind} {ref!r} fits several sessions ({shown}{more}); give the session's number"
        )
        self.ref = ref
        self.candidates = tuple(candidates[:AMBIGUOUS_SHOWN])


async def resolve_session_ref(
    db: Database, ref: str | uuid.UUID, owner_id: UserId | None
) -> uuid.UUID:
    """The id of the session `ref` names among `owner_id`'s sessions (None: everyone's)."""
    text = str(ref).strip()
    as_id = full_session_id(ref)
    if as_id is not None:
        return await _one_by(db, sessions.c.id == as_id, owner_id, text)
    if _NUMBER.fullmatch(text):
        found = await _ids(db, sessions.c.number == int(text), owner_id, limit=1)
        if found:
            return found[0].id
    if text:
        # A retried attempt keeps its name but no longer answers to it: the name names the
        # newest attempt of its retry chain (`domain.retry`).
        newest = sessions.c.retry_decision.is_distinct_from(RetryDecision.SCHEDULED.value)
        named = await _ids(
            db, sa.and_(sessions.c.name == text, newest), owner_id, limit=AMBIGUOUS_SHOWN + 1
        )
        if len(named) > 1:
            raise AmbiguousSessionRefError(text, "name", named)
        if named:
            return named[0].id
    prefix = text.lower()
    if _ID_PREFIX.fullmatch(prefix):
        digits = prefix.replace("-", "")
        if 0 < len(digits) <= _ID_DIGITS:
            low = uuid.UUID(digits.ljust(_ID_DIGITS, "0"))
            high = uuid.UUID(digits.ljust(_ID_DIGITS, "f"))
            # A range of the primary key: an index scan on both backends (SQLite stores ids
            # as 32 hex digits, which sort as the ids do).
            matching = await _ids(
                db, sessions.c.id.between(low, high), owner_id, limit=AMBIGUOUS_SHOWN + 1
            )
            if len(matching) > 1:
                raise AmbiguousSessionRefError(text, "id prefix", matching)
            if matching:
                return matching[0].id
    raise SessionRefNotFoundError(text)


def full_session_id(ref: str | uuid.UUID) -> uuid.UUID | None:
    """`ref` as a full session id, if it is one (with or without dashes)."""
    if isinstance(ref, uuid.UUID):
        return ref
    text = ref.strip()
    if len(text) not in (32, 36):
        return None
    try:
        return uuid.UUID(text)
    except ValueError:
        return None


async def _one_by(
    db: Database, where: sa.ColumnElement[bool], owner_id: UserId | None, ref: str
) -> uuid.UUID:
    found = await _ids(db, where, owner_id, limit=1)
    if not found:
        raise SessionRefNotFoundError(ref)
    return found[0].id


async def _ids(
    db: Database, where: sa.ColumnElement[bool], owner_id: UserId | None, *, limit: int
) -> list[Candidate]:
    """Up to `limit` sessions matching `where` that the caller can see, oldest first."""
    query = (
        sa.select(sessions.c.number, sessions.c.id, users.c.name)
        .select_from(sessions.join(users, users.c.id == sessions.c.owner_id))
        .where(where)
        .order_by(sessions.c.id)  # by creation: ids are UUIDv7
        .limit(limit)
    )
    if owner_id is not None:
        query = query.where(sessions.c.owner_id == owner_id)
    async with db.read_statements() as conn:
        rows = await conn.execute(query)
        return [Candidate(number, sid, owner) for number, sid, owner in rows]
