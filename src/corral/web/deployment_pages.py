"""The dashboard's deployment pages: the viewer's deployments (an admin's: everyone's) with
their status and replicas, and one deployment with its routes.

Both read through the API's own routes (`api.deployments`), so isolation is the API's: another
user's deployment is "no such deployment" to a plain user, by the list and by its URL alike.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request, Response

from corral.api import deployments
from corral.api.auth import Db
from corral.api.problems import Problem
from corral.web._render import page
from corral.web.auth import COOKIE_PATH, PageUser, now_of

router = APIRouter(prefix=f"{COOKIE_PATH}/deployments", include_in_schema=False)


@router.get("")
async def deployment_list(request: Request, user: PageUser, db: Db) -> Response:
    """Deployments, oldest first: lifecycle, replicas healthy / live / desired, revision."""
    found = await deployments.list_deployments(user, db)
    return page(request, "deployments.html", user, items=found.items, now=now_of(request))


@router.get("/{ref}")
async def deployment_page(
    request: Request,
    ref: Annotated[str, Path(min_length=1, max_length=64)],
    user: PageUser,
    db: Db,
) -> Response:
    """One deployment and its routes: each one's status, address, last probe and failures."""
    try:
        found = await deployments.get_deployment(ref, user, db)
    except Problem as exc:
        return page(
            request,
            "error.html",
            user,
            status_code=exc.status,
            title=exc.title,
            detail=exc.detail,
            back=("/deployments", "Back to the deployments"),
        )
    return page(request, "deployment.html", user, d=found, now=now_of(request))
