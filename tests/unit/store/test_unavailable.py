"""Which errors mean "the database is unavailable" (wait and retry) rather than a bug."""

from __future__ import annotations

import asyncpg
import pytest
import sqlalchemy as sa

from corral.store.unavailable import database_unavailable


def _wrapped(cause: BaseException) -> sa.exc.DBAPIError:
    """A plain DBAPIError (not flagged as a disconnect) raised from `cause`, as corral's direct
    statements translate a driver error."""
    adapted = Exception("connection was closed in the middle of operation")
    adapted.__cause__ = cause
    return sa.exc.DBAPIError("SELECT 1", None, adapted)


@pytest.mark.parametrize(
    "error",
    [
        ConnectionRefusedError(),
        TimeoutError(),
        sa.exc.TimeoutError("QueuePool limit reached"),
        sa.exc.OperationalError("SELECT 1", None, Exception("server closed the connection")),
        sa.exc.DBAPIError("SELECT 1", None, Exception("gone"), connection_invalidated=True),
        asyncpg.CannotConnectNowError("the database system is starting up"),
        _wrapped(asyncpg.ConnectionDoesNotExistError("connection was closed")),
    ],
)
def test_an_outage_is_recognised_also_down_the_chain_of_causes(error: BaseException) -> None:
    """Refused, reset, timed out, disconnected: unavailable, however SQLAlchemy wrapped it."""
    assert database_unavailable(error)


@pytest.mark.parametrize(
    "error",
    [
        ValueError("bad"),
        sa.exc.IntegrityError("INSERT", None, Exception("duplicate key")),
        sa.exc.ProgrammingError("SELECT", None, Exception('relation "x" does not exist')),
        _wrapped(ValueError("a bug")),
    ],
)
def test_a_bug_is_not_an_outage(error: BaseException) -> None:
    """A wrong statement or a plain bug is not waited out: the component raises it."""
    assert not database_unavailable(error)
