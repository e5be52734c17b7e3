"""Telling a database outage from a bug: which errors mean "wait and try again"."""

from __future__ import annotations

import asyncpg
import sqlalchemy as sa

# asyncpg's own errors for a connection that is gone, refused, or ended by the server (raised
# unwrapped by direct statements and by the lock and hint connections).
_DRIVER_ERRORS = (
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.TooManyConnectionsError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.InternalClientError,
)


def database_unavailable(error: BaseException) -> bool:
    """Whether `error` says the database could not be reached, or dropped or timed out the
    connection (wait and retry), rather than that a statement was wrong (a bug).

    Looks down the chain of causes: SQLAlchemy wraps the driver's error (sometimes as a plain
    DBAPIError, not flagged as a disconnect, when corral's direct statements translate it).
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _says_unavailable(current):
            return True
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return False


def _says_unavailable(error: BaseException) -> bool:
    # TimeoutError and ConnectionError are OSErrors; sa.exc.TimeoutError: no pooled connection.
    if isinstance(error, OSError | sa.exc.TimeoutError | sa.exc.DisconnectionError):
        return True
    if isinstance(error, sa.exc.DBAPIError):
        return error.connection_invalidated or isinstance(
            error, sa.exc.OperationalError | sa.exc.InterfaceError
        )
    return isinstance(error, _DRIVER_ERRORS)
