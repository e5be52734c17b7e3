"""Users (admins manage them), API tokens (each user their own, admins anyone's), and
`GET /v1/me` for whoever calls."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Literal, cast

from fastapi import APIRouter, Path, Request, Response
from pydantic import BaseModel, Field

from corral.api._pages import Cursor, Limit, Page, decode_cursor, invalid_cursor, page_of
from corral.api.auth import AdminUser, CurrentUser, Db
from corral.api.problems import Problem
from corral.domain.bounds import Text
from corral.domain.events import Event
from corral.domain.tokens import MAX_TOKEN_LIFETIME_S, token_expiry
from corral.domain.types import USER_NAME_PATTERN, utcnow
from corral.infra.events import EventBus, EventBusError
from corral.store.user_directory import (
    TokenRecord,
    UserRecord,
    get_user_record,
    list_tokens,
    list_user_records,
)
from corral.store.users import (
    LastAdminError,
    Principal,
    UnknownUserError,
    UserExistsError,
    UserHasSessionsError,
    create_user,
    delete_user,
    issue_token,
    revoke_token,
    set_role,
)

if TYPE_CHECKING:
    from corral.api.app import ApiContext

router = APIRouter(tags=["users"])
logger = logging.getLogger(__name__)

USERS_LISTING = "users"
TOKENS_LISTING = "tokens"
UserName = Annotated[str, Path(max_length=64)]
Role = Literal["admin", "user"]


class Me(BaseModel):
    """Who the caller is."""

    id: uuid.UUID
    name: str
    role: Role


class UserOut(BaseModel):
    """A user."""

    id: uuid.UUID
    name: str
    role: Role
    created_at: datetime


class UserPage(Page[UserOut]):
    """A page of users; `next_cursor` fetches the next one."""


class UserCreate(BaseModel):
    """A new user."""

    name: str = Field(
        pattern=USER_NAME_PATTERN, description="1 to 64 letters, digits, '.', '_', '-'"
    )
    role: Role = "user"


class UserPatch(BaseModel):
    """Changes to a user."""

    role: Role = Field(description="`admin` or `user`; the last admin stays one")


class TokenCreate(BaseModel):
    """A new API token for a user."""

    name: Text = Field(min_length=1, max_length=64, description="what the token is for")
    expires_in_s: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TOKEN_LIFETIME_S,
        description="seconds it lasts; left out: the manager's token_ttl_days; null: for ever",
    )


class TokenOut(BaseModel):
    """An API token's metadata (its secret is shown only when it is created)."""

    id: uuid.UUID
    name: str
    created_at: datetime
    expires_at: datetime | None
    last_used_at: datetime | None


class TokenPage(Page[TokenOut]):
    """A page of tokens; `next_cursor` fetches the next one."""


class IssuedTokenOut(BaseModel):
    """A token just created: `token` is the secret, shown this once and never again."""

    id: uuid.UUID
    name: str
    user: str
    token: str
    created_at: datetime
    expires_at: datetime | None


@router.get("/v1/me", response_model=Me, operation_id="get_me")
async def me(user: CurrentUser) -> Me:
    """The user the bearer token belongs to."""
    return Me(id=user.user_id, name=user.name, role=cast(Role, user.role))


@router.get("/v1/users", response_model=UserPage, operation_id="list_users")
async def users_list(
    admin: AdminUser, db: Db, limit: Limit = 100, cursor: Cursor = None
) -> UserPage:
    """Users by name."""
    rows = await list_user_records(
        db, after_name=decode_cursor(USERS_LISTING, cursor, str), limit=limit + 1
    )
    page = page_of(USERS_LISTING, rows, limit, lambda u: u.name)
    return UserPage(items=[_user_out(u) for u in page.items], next_cursor=page.next_cursor)


@router.post("/v1/users", response_model=UserOut, status_code=201, operation_id="create_user")
async def user_create(body: UserCreate, admin: AdminUser, db: Db) -> UserOut:
    """Create a user (no token yet: issue one with `POST /v1/users/{name}/tokens`)."""
    try:
        await create_user(db, body.name, body.role, utcnow())
    except UserExistsError as exc:
        raise Problem(409, "user-exists", "User exists", str(exc)) from exc
    logger.info("user.created", extra={"user": body.name, "role": body.role, "by": admin.name})
    return _user_out(await _existing(db, body.name))


@router.patch("/v1/users/{name}", response_model=UserOut, operation_id="update_user")
async def user_update(
    name: UserName, body: UserPatch, admin: AdminUser, db: Db, request: Request
) -> UserOut:
    """Change a user's role; 409 when the last admin would stop being one."""
    try:
        event = await set_role(db, name, body.role, utcnow())
    except UnknownUserError as exc:
        raise _user_not_found(name) from exc
    except LastAdminError as exc:
        raise Problem(409, "last-admin", "The last admin", str(exc)) from exc
    if event is not None:
        logger.info(event.kind, extra={"user": name, "role": body.role, "by": admin.name})
        await _tokens_changed(request, event)
    return _user_out(await _existing(db, name))


@router.delete("/v1/users/{name}", status_code=204, operation_id="delete_user")
async def user_delete(name: UserName, admin: AdminUser, db: Db, request: Request) -> Response:
    """Remove a user who owns no session, with their tokens and uploads; 409 when they own
    sessions or are the last admin."""
    try:
        event, *groups = await delete_user(db, name, utcnow())
    except UnknownUserError as exc:
        raise _user_not_found(name) from exc
    except LastAdminError as exc:
        raise Problem(409, "last-admin", "The last admin", str(exc)) from exc
    except UserHasSessionsError as exc:
        raise Problem(
            409,
            "user-has-sessions",
            "User owns sessions",
            str(exc),
            sessions=exc.total,
            active_sessions=exc.active,
        ) from exc
    logger.info(event.kind, extra={"user": name, "by": admin.name})
    await _tokens_changed(request, event)
    for changed in groups:  # taken off the groups' users: other managers' kept options go
        logger.info(changed.kind, extra={"resource_group": changed.entity_id, "by": admin.name})
    context: ApiContext = request.app.state.context
    if groups and context.events is not None:
        await context.events.publish_after_commit(groups)
    return Response(status_code=204)


@router.get("/v1/users/{name}/tokens", response_model=TokenPage, operation_id="list_user_tokens")
async def tokens_list(
    name: UserName, user: CurrentUser, db: Db, limit: Limit = 100, cursor: Cursor = None
) -> TokenPage:
    """The user's tokens (without their secrets), by id: one's own, or anyone's for admins."""
    owner = await _token_owner(db, user, name)
    after = decode_cursor(TOKENS_LISTING, cursor, str)
    rows = await list_tokens(
        db, owner.id, after_id=None if after is None else _token_id(after), limit=limit + 1
    )
    page = page_of(TOKENS_LISTING, rows, limit, lambda t: str(t.id))
    return TokenPage(items=[_token_out(t) for t in page.items], next_cursor=page.next_cursor)


@router.post(
    "/v1/users/{name}/tokens",
    response_model=IssuedTokenOut,
    status_code=201,
    operation_id="create_user_token",
)
async def token_create(
    name: UserName, body: TokenCreate, user: CurrentUser, db: Db, request: Request
) -> IssuedTokenOut:
    """Issue an API token for the user (oneself, or anyone for admins); its secret is in this
    answer only. Without `expires_in_s` it lasts the manager's `token_ttl_days`."""
    owner = await _token_owner(db, user, name)
    now = utcnow()
    lifetime_s: float | None = body.expires_in_s
    if "expires_in_s" not in body.model_fields_set:
        lifetime_s = request.app.state.token_ttl_s
    expires_at = token_expiry(now, lifetime_s)
    issued = await issue_token(db, owner.id, body.name, now, expires_at)
    logger.info(
        "token.issued",
        extra={"user": name, "token_id": str(issued.id), "by": user.name},
    )
    return IssuedTokenOut(
        id=issued.id,
        name=body.name,
        user=name,
        token=issued.secret,
        created_at=now,
        expires_at=expires_at,
    )


@router.delete("/v1/tokens/{token_id}", status_code=204, operation_id="revoke_token")
async def token_revoke(
    token_id: uuid.UUID, user: CurrentUser, db: Db, request: Request
) -> Response:
    """Revoke a token (one's own, or anyone's for admins): refused at once by this manager
    and, through the event bus, by every other (without a bus, within `auth.CACHE_S`)."""
    owner = None if user.is_admin else user.user_id
    revoked = await revoke_token(db, token_id, utcnow(), owner=owner)
    if revoked is None:
        raise Problem(
            404,
            "token-not-found",
            "No such token",
            f"token {token_id} does not exist (or was revoked already); "
            "`corral token ls` lists your tokens",
        )
    logger.info("token.revoked", extra={"token_id": str(token_id), "by": user.name})
    await _tokens_changed(request, revoked)
    return Response(status_code=204)


async def _tokens_changed(request: Request, event: Event) -> None:
    """What tokens mean changed: forget them here now, and tell the other managers."""
    # The token → user cache is keyed by secret, which is not known here: drop it all.
    request.app.state.token_cache.clear()
    bus: EventBus | None = request.app.state.context.events
    if bus is not None:
        try:
            await bus.publish([event])
        except EventBusError as exc:
            # Committed; the other managers' caches expire within CACHE_S.
            logger.warning("token.change_not_published", extra={"error": repr(exc)})


async def _token_owner(db: Db, caller: Principal, name: str) -> UserRecord:
    """The user whose tokens `caller` asks for: themselves, or anyone for an admin."""
    if name != caller.name and not caller.is_admin:
        raise Problem(
            403,
            "forbidden",
            "Not your tokens",
            f"you ({caller.name}) may manage only your own tokens; {name!r}'s need an admin",
        )
    return await _existing(db, name)


async def _existing(db: Db, name: str) -> UserRecord:
    user = await get_user_record(db, name)
    if user is None:
        raise _user_not_found(name)
    return user


def _user_not_found(name: str) -> Problem:
    return Problem(
        404,
        "user-not-found",
        "No such user",
        f"user {name!r} does not exist; `corral user ls` (GET /v1/users) lists the users",
    )


def _token_id(key: str) -> uuid.UUID:
    try:
        return uuid.UUID(key)
    except ValueError as exc:
        # Our cursors of this list always hold a token id: this one was not issued by us.
        raise invalid_cursor(key) from exc


def _user_out(user: UserRecord) -> UserOut:
    return UserOut(
        id=user.id,
        name=user.name,
        role=cast(Role, user.role),
        created_at=user.created_at,
    )


def _token_out(token: TokenRecord) -> TokenOut:
    return TokenOut(
        id=token.id,
        name=token.name,
        created_at=token.created_at,
        expires_at=token.expires_at,
        last_used_at=token.last_used_at,
    )
