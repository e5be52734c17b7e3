"""`/v1/uploads/{digest}`: directories users upload for their sessions (`corral run --upload`).

The client asks first (`GET`, 404 when the caller has no upload of that digest) and only then
sends the archive (`PUT`, the raw tar.gz as the body), so a tree uploaded before is not sent
again. The body must be a gzip stream whose sha256 is the digest in the path, and no larger
than the manager's `upload_max_bytes` (413, naming both sizes). Uploads are per owner: a user
sees, and may name in a session, only their own.
"""

from __future__ import annotations

import hashlib
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path, Request, Response
from pydantic import BaseModel

from corral.api.auth import CurrentUser, Db
from corral.api.problems import Problem
from corral.domain.spec import UPLOAD_DIGEST_RE
from corral.domain.types import utcnow
from corral.store.uploads import UploadInfo, store_upload, touch_upload

router = APIRouter(prefix="/v1/uploads", tags=["uploads"])

DEFAULT_UPLOAD_MAX_BYTES = 100 * 1024 * 1024
_GZIP_MAGIC = b"\x1f\x8b"

Digest = Annotated[
    str,
    Path(
        pattern=f"^{UPLOAD_DIGEST_RE.pattern}$",
        description="sha256 of the archive, 64 lowercase hex digits",
    ),
]


class UploadOut(BaseModel):
    """An upload the caller stored."""

    digest: str
    size_bytes: int
    created_at: datetime


def _out(info: UploadInfo) -> UploadOut:
    return UploadOut(digest=info.digest, size_bytes=info.size_bytes, created_at=info.created_at)


@router.get("/{digest}", response_model=UploadOut, operation_id="get_upload")
async def get_upload(digest: Digest, user: CurrentUser, db: Db) -> UploadOut:
    """Whether the caller uploaded this archive already (404: not yet, send it); asking
    keeps an upload no session names for the manager's `unused_upload_hours` from now."""
    found = await touch_upload(db, user.user_id, digest, utcnow())
    if found is None:
        raise Problem(404, "upload-not-found", "No such upload", f"you have no upload {digest}")
    return _out(found)


@router.put(
    "/{digest}",
    status_code=201,
    response_model=UploadOut,
    responses={200: {"model": UploadOut, "description": "Uploaded before: nothing changed"}},
    openapi_extra={
        "requestBody": {
            "required": True,
            # Any media type is taken (the client says application/gzip): the bytes are checked.
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
        }
    },
    operation_id="put_upload",
)
async def put_upload(
    digest: Digest, user: CurrentUser, db: Db, request: Request, response: Response
) -> UploadOut:
    """Store a tar.gz whose sha256 is `digest` (201); one stored before answers 200."""
    cap: int = request.app.state.upload_max_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > cap:
        raise _too_large(int(declared), cap)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > cap:
            raise _too_large(len(body), cap)  # no honest length declared: stop reading here
    if not body.startswith(_GZIP_MAGIC):
        raise _invalid("body", "the body is not a gzip stream; send the tar.gz itself")
    actual = hashlib.sha256(body).hexdigest()
    if actual != digest:
        raise _invalid("digest", f"the body's sha256 is {actual}, not the digest in the path")
    info, stored = await store_upload(db, user.user_id, digest, bytes(body), utcnow())
    if not stored:
        response.status_code = 200
    return _out(info)


def _too_large(size: int, cap: int) -> Problem:
    return Problem(
        413,
        "upload-too-large",
        "The upload is too large",
        f"the upload is {size} bytes ({size / 2**20:.1f} MiB), over the manager's cap of "
        f"{cap} bytes ({cap / 2**20:.1f} MiB, setting upload_max_bytes); leave large files "
        "out with a .corralignore",
        errors=[{"field": "upload", "message": f"{size} bytes is over the cap of {cap}"}],
    )


def _invalid(field: str, message: str) -> Problem:
    return Problem(
        422,
        "validation-error",
        "The request is not valid",
        message,
        errors=[{"field": field, "message": message}],
    )
