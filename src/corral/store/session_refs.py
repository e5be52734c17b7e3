"""What a user types to name a session or a job array: an id, a number, `12_7`, a name, a prefix.

Every API route that takes a session resolves it here, and the CLI sends what the user typed
to those routes, so a reference means the same everywhere. A reference is read as, in turn:

1. a full id (`0192f3a4-…`, with or without dashes): that session;
2. an array element (`12_7`, `domain.refs`): element 7 of the array numbered 12;
3. a number (digits, no leading zero: `1234`): that session, or, when it is a job array's
   first element, the whole array (Slurm's array job id is its first task's job id);
4. a name: the one session of that name the caller can see (of a retry chain, the newest
   attempt), or the one array whose elements all bear it;
5. an id prefix (hex digits and dashes: `0192f3a4-5b`): the one session whose id starts so.

The first reading that finds a session the caller can see wins; a name or prefix that fits
several is ambiguous (the candidates' numbers say which to type). Only the caller's own
sessions are searched, unless the caller is an admin: another user's number is "not found".
Where one session is needed (`resolve_session_ref`), a reference to a whole array is refused
with a hint to name an element.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence

import sqlalchemy as sa

from corral.domain.record import record
from corral.domain.refs import NUMBER, element_ref, parse_element_ref
from corral.domain.retry.decide import RetryDecision
from corral.domain.types import UserId
from corral.store.database import Database
from corral.store.tables import sessions, users

AMBIGUOUS_SHOWN = 10  # candidates an ambiguous reference names
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
    """A session a reference fits: its number, id, owner, and its place in a job array."""

    number: int
    id: uuid.UUID
    owner: str
    array_id: uuid.UUID | None = None
    array_number: int | None = None
    array_index: int | None = None

    @property
    def ref(self) -> str:
        """What to type for it alone: `12_7` for an array's element, else its number."""
        if self.array_number is not None and self.array_index is not None:
            return element_ref(self.array_number, self.array_index)
        return str(self.number)


@record
class ArrayTarget:
    """A whole job array: its id (its first element's session id) and number, and the index
    of its first element."""

    id: uuid.UUID
    number: int
    first_index: int
    owner: str


class AmbiguousSessionRefError(SessionRefError):
    """A name or id prefix that fits several sessions; `candidates` (by number) say which."""

    def __init__(
        self, ref: str, kind: str, candidates: Sequence[Candidate], *, whole_arrays: bool = False
    ) -> None:
        # A name is borne by every element of an array: the arrays' numbers say which.
        refs = list(
            dict.fromkeys(
                str(c.array_number) if whole_arrays and c.array_number is not None else c.ref
                for c in candidates
            )
        )
        shown = ", ".join(refs[:AMBIGUOUS_SHOWN])
        more = ", ..." if len(refs) > AMBIGUOUS_SHOWN else ""
        super().__init__(
            f"{kind} {ref!r} fits several sessions ({shown}{more}); give the session's number"
        )
        self.ref = ref
        self.candidates = tuple(candidates[:AMBIGUOUS_SHOWN])


class RefNamesArrayError(SessionRefError):
    """The reference names a whole job array where one session is needed."""

    def __init__(self, ref: str, array: ArrayTarget) -> None:
        first = element_ref(array.number, array.first_index)
        super().__init__(
            f"{ref!r} names job array {array.number}, not one session: name one of its "
            f"elements as {array.number}_INDEX, like {first}"
        )
        self.ref = ref
        self.array = array


class ArrayRefNotFoundError(SessionRefError):
    """No job array the caller can see answers to the reference."""

    def __init__(self, ref: str) -> None:
        super().__init__(f"no job array you can see has the number, id or name {ref!r}")
        self.ref = ref


async def resolve_session_ref(
    db: Database, ref: str | uuid.UUID, owner_id: UserId | None
) -> uuid.UUID:
    """The id of the one session `ref` names among `owner_id`'s sessions (None: everyone's);
    RefNamesArrayError when it names a whole job array."""
    found = await resolve_ref(db, ref, owner_id)
    if isinstance(found, ArrayTarget):
        raise RefNamesArrayError(str(ref).strip(), found)
    return found


async def resolve_array_ref(
    db: Database, ref: str | uuid.UUID, owner_id: UserId | None
) -> ArrayTarget:
    """The job array `ref` names: by its number or name, or by its id (its first element's)."""
    text = str(ref).strip()
    try:
        found = await resolve_ref(db, ref, owner_id)
    except SessionRefNotFoundError:
        raise ArrayRefNotFoundError(text) from None
    if isinstance(found, ArrayTarget):
        return found
    if full_session_id(ref) is not None:
        # The full id of an array's first element is the array's id (`array_id`).
        array = await _whole_array(db, sessions.c.array_id == found, owner_id)
        if array is not None:
            return array
    raise ArrayRefNotFoundError(text)


async def resolve_ref(
    db: Database, ref: str | uuid.UUID, owner_id: UserId | None
) -> uuid.UUID | ArrayTarget:
    """The session (its id) or the whole job array `ref` names, among `owner_id`'s sessions
    (None: everyone's)."""
    text = str(ref).strip()
    as_id = full_session_id(ref)
    if as_id is not None:
        return (await _one_by(db, sessions.c.id == as_id, owner_id, text)).id
    element = parse_element_ref(text)
    if element is not None:
        where = sa.and_(
            sessions.c.array_number == element.array_number,
            sessions.c.array_index == element.index,
        )
        return (await _one_by(db, where, owner_id, text)).id
    if NUMBER.fullmatch(text):
        number = int(text)
        found = await _candidates(db, sessions.c.number == number, owner_id, limit=1)
        if found and found[0].array_number != number:
            return found[0].id
        # The array's first element, or the array after that element was removed.
        array = await _whole_array(db, sessions.c.array_number == number, owner_id)
        if array is not None:
            return array
    if text:
        named = await _by_name(db, text, owner_id)
        if named is not None:
            return named
    prefix = text.lower()
    if _ID_PREFIX.fullmatch(prefix):
        digits = prefix.replace("-", "")
        if 0 < len(digits) <= _ID_DIGITS:
            low = uuid.UUID(digits.ljust(_ID_DIGITS, "0"))
            high = uuid.UUID(digits.ljust(_ID_DIGITS, "f"))
            # A range of the primary key: an index scan on both backends (SQLite stores ids
            # as 32 hex digits, which sort as the ids do).
            matching = await _candidates(
                db, sessions.c.id.between(low, high), owner_id, limit=AMBIGUOUS_SHOWN + 1
            )
            if len(matching) > 1:
                raise AmbiguousSessionRefError(text, "id prefix", matching)
            if matching:
                return matching[0].id
    raise SessionRefNotFoundError(text)


async def _whole_array(
    db: Database, where: sa.ColumnElement[bool], owner_id: UserId | None
) -> ArrayTarget | None:
    """The array of the elements matching `where` (one array's), by its lowest element."""
    query = (
        sa.select(
            sessions.c.array_id, sessions.c.array_number, sessions.c.array_index, users.c.name
        )
        .select_from(sessions.join(users, users.c.id == sessions.c.owner_id))
        .where(where, sessions.c.array_number.is_not(None))
        .order_by(sessions.c.array_index)
        .limit(1)
    )
    if owner_id is not None:
        query = query.where(sessions.c.owner_id == owner_id)
    async with db.read_statements() as conn:
        row = (await conn.execute(query)).first()
    return None if row is None else ArrayTarget(*row)


async def _by_name(
    db: Database, name: str, owner_id: UserId | None
) -> uuid.UUID | ArrayTarget | None:
    """The one session, or the one array, named `name`; None when nothing is. A retried
    attempt keeps its name but no longer answers to it: the name names the newest attempt of
    its retry chain (`domain.retry`)."""
    newest = sessions.c.retry_decision.is_distinct_from(RetryDecision.SCHEDULED.value)
    named_so = sa.and_(sessions.c.name == name, newest)
    named = await _candidates(db, named_so, owner_id, limit=AMBIGUOUS_SHOWN + 1)
    if not named:
        return None
    arrays = {c.array_id for c in named}
    if len(arrays) == 1 and None not in arrays:
        # Every element of an array bears its name: the array, if no other session does.
        (array_id,) = arrays
        others = sa.and_(
            named_so,
            sa.or_(sessions.c.array_id.is_(None), sessions.c.array_id != array_id),
        )
        other = await _candidates(db, others, owner_id, limit=AMBIGUOUS_SHOWN)
        if other:
            raise AmbiguousSessionRefError(name, "name", [named[0], *other], whole_arrays=True)
        return await _whole_array(db, sessions.c.array_id == array_id, owner_id)
    if len(named) > 1:
        raise AmbiguousSessionRefError(name, "name", named, whole_arrays=True)
    return named[0].id


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
) -> Candidate:
    found = await _candidates(db, where, owner_id, limit=1)
    if not found:
        raise SessionRefNotFoundError(ref)
    return found[0]


async def _candidates(
    db: Database, where: sa.ColumnElement[bool], owner_id: UserId | None, *, limit: int
) -> list[Candidate]:
    """Up to `limit` sessions matching `where` that the caller can see, oldest first."""
    query = (
        sa.select(
            sessions.c.number,
            sessions.c.id,
            users.c.name,
            sessions.c.array_id,
            sessions.c.array_number,
            sessions.c.array_index,
        )
        .select_from(sessions.join(users, users.c.id == sessions.c.owner_id))
        .where(where)
        .order_by(sessions.c.id)  # by creation: ids are UUIDv7
        .limit(limit)
    )
    if owner_id is not None:
        query = query.where(sessions.c.owner_id == owner_id)
    async with db.read_statements() as conn:
        rows = await conn.execute(query)
        return [Candidate(*row) for row in rows]
