"""Resource groups: any user lists and reads them; admins create, change and delete them."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Path, Request, Response
from pydantic import BaseModel, Field, ValidationError

from corral.api._pages import Cursor, Limit, Page, decode_cursor, page_of
from corral.api.auth import AdminUser, CurrentUser, Db
from corral.api.problems import Problem, invalid_request
from corral.coordination.hints import Hint
from corral.domain.bounds import NAME_PATTERN, Text
from corral.domain.events import Event
from corral.domain.field_errors import FieldError, field_errors
from corral.domain.resource_group import ResourceGroupOptions
from corral.store.resource_group_store import (
    ResourceGroupExistsError,
    ResourceGroupInUseError,
    ResourceGroupRecord,
    UnknownResourceGroupError,
    create_group,
    delete_group,
    get_group,
    list_groups,
    update_group,
)
from corral.store.user_directory import unknown_user_names

if TYPE_CHECKING:
    from corral.api.app import ApiContext

router = APIRouter(prefix="/v1/resource-groups", tags=["resource groups"])
logger = logging.getLogger(__name__)

LISTING = "resource-groups"
GroupName = Annotated[str, Path(max_length=64)]


class ResourceGroupOut(BaseModel):
    """A resource group and its effective options (defaults filled in)."""

    name: str
    description: str
    options: ResourceGroupOptions
    created_at: datetime


class ResourceGroupPage(Page[ResourceGroupOut]):
    """A page of resource groups; `next_cursor` fetches the next one."""


class ResourceGroupCreate(BaseModel):
    """A new resource group."""

    name: str = Field(pattern=NAME_PATTERN, description="1 to 64 letters, digits, '.', '_', '-'")
    description: Text = Field(default="", max_length=256)
    options: ResourceGroupOptions = Field(default_factory=ResourceGroupOptions)


class ResourceGroupPatch(BaseModel):
    """Changes to a group: a new description, and options merged into the current ones."""

    description: Text | None = Field(default=None, max_length=256)
    options: dict[str, Any] | None = Field(
        default=None,
        description="a JSON merge patch (RFC 7396) of the options: given keys replace the "
        "current ones, null resets a key to its default; the result must be valid options",
    )


@router.get("", response_model=ResourceGroupPage, operation_id="list_resource_groups")
async def groups_list(
    user: CurrentUser, db: Db, limit: Limit = 100, cursor: Cursor = None
) -> ResourceGroupPage:
    """Resource groups by name."""
    rows = await list_groups(db, after_name=decode_cursor(LISTING, cursor, str), limit=limit + 1)
    page = page_of(LISTING, rows, limit, lambda g: g.name)
    return ResourceGroupPage(items=[_out(g) for g in page.items], next_cursor=page.next_cursor)


@router.get("/{name}", response_model=ResourceGroupOut, operation_id="get_resource_group")
async def group_get(name: GroupName, user: CurrentUser, db: Db) -> ResourceGroupOut:
    """One resource group; 404 if there is no such group."""
    group = await get_group(db, name)
    if group is None:
        raise _not_found(name)
    return _out(group)


@router.post(
    "", response_model=ResourceGroupOut, status_code=201, operation_id="create_resource_group"
)
async def group_create(
    body: ResourceGroupCreate, admin: AdminUser, db: Db, request: Request
) -> ResourceGroupOut:
    """Create a resource group; 409 if the name is taken."""
    context: ApiContext = request.app.state.context
    await _check_users(db, body.options.allowed_users)
    try:
        group, events = await create_group(
            db, body.name, body.description, body.options, context.agents.clock()
        )
    except ResourceGroupExistsError as exc:
        raise Problem(409, "resource-group-exists", "Resource group exists", str(exc)) from exc
    await _after_change(context, events, admin.name)
    # A group made with all-or-nothing admission on: EvictNotReady is to watch it from now.
    await context.agents.hints.set_after_commit(Hint.ADMISSION.value)
    return _out(group)


@router.patch("/{name}", response_model=ResourceGroupOut, operation_id="update_resource_group")
async def group_update(
    name: GroupName, body: ResourceGroupPatch, admin: AdminUser, db: Db, request: Request
) -> ResourceGroupOut:
    """Change a group's description or options (merged, then validated as a whole)."""
    context: ApiContext = request.app.state.context
    listed = (body.options or {}).get("allowed_users")
    if isinstance(listed, list) and all(isinstance(name, str) for name in listed):
        await _check_users(db, listed)  # anything else: the options' validation names it
    try:
        group, events = await update_group(
            db,
            name,
            context.agents.clock(),
            description=body.description,
            options_patch=body.options,
        )
    except UnknownResourceGroupError as exc:
        raise _not_found(name) from exc
    except ValidationError as exc:
        raise _invalid_options(exc) from exc
    await _after_change(context, events, admin.name)
    # New options may let pending sessions of the group fit (ordering, limits), and may turn
    # all-or-nothing admission on or change its timeouts: EvictNotReady, which looks again
    # only when a timeout it knows of comes due, must read them now.
    await context.agents.hints.set_after_commit(Hint.SCHEDULE.value, Hint.ADMISSION.value)
    return _out(group)


@router.delete("/{name}", status_code=204, operation_id="delete_resource_group")
async def group_delete(name: GroupName, admin: AdminUser, db: Db, request: Request) -> Response:
    """Delete an unused group; 409 for `default` or a group with agents or live sessions."""
    context: ApiContext = request.app.state.context
    try:
        events = await delete_group(db, name, context.agents.clock())
    except UnknownResourceGroupError as exc:
        raise _not_found(name) from exc
    except ResourceGroupInUseError as exc:
        raise Problem(409, exc.reason, "Resource group in use", str(exc)) from exc
    await _after_change(context, events, admin.name)
    return Response(status_code=204)


async def _check_users(db: Db, names: Sequence[str] | None) -> None:
    """422 on `options.allowed_users` naming those of `names` no user has."""
    unknown = await unknown_user_names(db, names or ())
    if unknown:
        raise invalid_request(
            [
                FieldError(
                    "options.allowed_users",
                    f"no user is named {', '.join(repr(n) for n in unknown)}; "
                    "`corral user ls` lists the users",
                )
            ]
        )


def _out(group: ResourceGroupRecord) -> ResourceGroupOut:
    return ResourceGroupOut(
        name=group.name,
        description=group.description,
        options=ResourceGroupOptions.model_validate(group.options),
        created_at=group.created_at,
    )


async def _after_change(context: ApiContext, events: list[Event], by: str) -> None:
    for event in events:
        logger.info(event.kind, extra={"resource_group": event.entity_id, "by": by})
    if events and context.events is not None:
        await context.events.publish_after_commit(events)


def _invalid_options(exc: ValidationError) -> Problem:
    return invalid_request(field_errors(exc, under=("options",)))


def _not_found(name: str) -> Problem:
    return Problem(
        404,
        "resource-group-not-found",
        "No such resource group",
        f"resource group {name!r} does not exist; `GET /v1/resource-groups` lists them",
    )
