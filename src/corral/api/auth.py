"""Who is calling: bearer tokens of users (roles `admin` and `user`).

Every route but the agent protocol's (which has its own tokens) and the health probes depends
on `CurrentUser`; admin-only routes on `AdminUser`. A user sees and acts on only their own
sessions: for anything else the API answers 404, as if it did not exist.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from corral.api.problems import Problem
from corral.domain.types import utcnow
from corral.store.database import Database
from corral.store.users import Principal, token_holder

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


# The OpenAPI document's security scheme ("HTTPBearer"): every route that needs a token says so
# there, rather than as an `Authorization` header parameter. A missing or malformed header is our
# own 401 problem below, not FastAPI's 403.
BEARER_SCHEME = HTTPBearer(
    auto_error=False,
    description="a user's token, or for the agent protocol the join token to register, then "
    "the agent's own",
)


async def bearer(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER_SCHEME)],
) -> str:
    """The request's bearer token; 401 without one."""
    token = credentials.credentials if credentials is not None else ""
    if not token.strip():
        raise Problem(
            401,
            "unauthenticated",
            "Authentication required",
            "send 'Authorization: Bearer <token>': a user's token (`corral up` prints an "
            "admin's; admins make users' tokens), or for agents the join token to register, "
            "then the agent's own",
        )
    return token.strip()


# A token → (cached until, by the monotonic clock; its user; when the token expires).
TokenCache = dict[str, tuple[float, Principal, datetime | None]]


async def current_user(request: Request, token: Annotated[str, Depends(bearer)]) -> Principal:
    """The user the bearer token belongs to; 401 for an unknown or an expired token."""
    cache: TokenCache = request.app.state.token_cache
    now = time.monotonic()
    cached = cache.get(token)
    if cached is not None and cached[0] > now:
        _, principal, expires_at = cached
    else:
        holder = await token_holder(await database(request), token)
        if holder is None:
            raise Problem(
                401,
                "unauthenticated",
                "Unknown token",
                "the token is unknown (revoked, or never issued); ask an admin for one",
            )
        principal, expires_at = holder.principal, holder.expires_at
        if len(cache) > 10_000:
            cache.clear()
        cache[token] = (now + CACHE_S, principal, expires_at)
    if expires_at is not None and expires_at <= utcnow():
        raise Problem(
            401,
            "token-expired",
            "Token expired",
            f"the token expired at {expires_at.isoformat(timespec='seconds')}; make a new one "
            "with a token of yours still valid (`corral token create`), or ask an admin",
        )
    return principal


async def admin_user(user: Annotated[Principal, Depends(current_user)]) -> Principal:
    """The caller, who must be an admin; 403 otherwise."""
    if not user.is_admin:
        raise Problem(
            403,
            "forbidden",
            "Admins only",
            f"only admins may do this, and user {user.name!r} is not an admin; ask one",
        )
    return user


CurrentUser = Annotated[Principal, Depends(current_user)]
AdminUser = Annotated[Principal, Depends(admin_user)]
Db = Annotated[Database, Depends(database)]
