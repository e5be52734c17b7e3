"""Who is calling: bearer tokens of users (roles `admin` and `user`).

Every route but the agent protocol's (which has its own tokens) and the health probes depends
on `CurrentUser`; admin-only routes on `AdminUser`. A user sees and acts on only their own
sessions: for anything else the API answers 404, as if it did not exist.
"""

from __future__ import annotations

import logging
import time
from typing import Annotated

from fastapi import Depends, Header, Request

from corral.api.problems import Problem
from corral.domain.types import utcnow
from corral.store.database import Database
from corral.store.users import Principal, principal_for

logger = logging.getLogger(__name__)

# A token's user is remembered this long, so a busy client costs no query per request. A
# revocation clears the cache of every manager through the event bus at once; without the bus
# (down, or an app without one), a revoked token may work on another manager this long.
CACHE_S = 5.0


# Dependencies are coroutines even when they do not await: FastAPI runs a plain function in a
# worker thread, two thread hops per request for nothing.


async def database(request: Request) -> Database:
    """The manager's database."""
    db: Database = request.app.state.db
    return db


async def bearer(authorization: Annotated[str | None, Header()] = None) -> str:
    """The request's bearer token; 401 without one."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Problem(
            401,
            "unauthenticated",
            "Authentication required",
            "send 'Authorization: Bearer <token>': a user's token (`corral up` prints an "
            "admin's; admins make users' tokens), or for agents the join token to register, "
            "then the agent's own",
        )
    return token.strip()


async def current_user(request: Request, token: Annotated[str, Depends(bearer)]) -> Principal:
    """The user the bearer token belongs to; 401 for an unknown or expired token."""
    cache: dict[str, tuple[float, Principal]] = request.app.state.token_cache
    now = time.monotonic()
    cached = cache.get(token)
    if cached is not None and cached[0] > now:
        return cached[1]
    principal = await principal_for(await database(request), token, utcnow())
    if principal is None:
        raise Problem(401, "unauthenticated", "Unknown token", "the token is unknown or expired")
    if len(cache) > 10_000:
        cache.clear()
    cache[token] = (now + CACHE_S, principal)
    return principal


async def admin_user(user: Annotated[Principal, Depends(current_user)]) -> Principal:
    """The caller, who must be an admin; 403 otherwise."""
    if not user.is_admin:
        raise Problem(403, "forbidden", "Admins only", f"user {user.name!r} is not an admin")
    return user


CurrentUser = Annotated[Principal, Depends(current_user)]
AdminUser = Annotated[Principal, Depends(admin_user)]
Db = Annotated[Database, Depends(database)]
