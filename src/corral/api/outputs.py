"""`/v1/sessions/{id}/outputs`: the files a session's kernels wrote to `CORRAL_OUTPUT_DIR`.

List them, download one, or all as one tar.gz. In the archive a session of one kernel has its
files at the top; a session of several has one folder per kernel, `kernel-<index>/`. Like every
session route: the owner or an admin; anyone else gets 404, as if the session did not exist.
"""

from __future__ import annotations

import asyncio
import io
import tarfile
import time
import uuid
from collections.abc import Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel

from corral.api.auth import CurrentUser, Db
from corral.api.problems import Problem
from corral.api.sessions import _visible
from corral.domain.types import KernelId
from corral.store.output_files import OutputEntry, list_output_files, read_output_file
from corral.store.session_views import kernel_at

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])

ARCHIVE_TYPE = "application/gzip"


class OutputFileOut(BaseModel):
    """One file a kernel left in its output directory."""

    kernel: int  # the kernel's cluster index (0: the main one)
    kernel_id: uuid.UUID
    name: str  # relative to the output directory, '/'-separated
    size_bytes: int


class OutputsOut(BaseModel):
    """A session's output files, by kernel and name."""

    items: list[OutputFileOut]


@router.get("/{session_id}/outputs", response_model=OutputsOut, operation_id="list_session_outputs")
async def list_outputs(session_id: uuid.UUID, user: CurrentUser, db: Db) -> OutputsOut:
    """The files the session's kernels left in CORRAL_OUTPUT_DIR (uploaded once each ended)."""
    found = await _visible(db, user, session_id)
    indexes = _indexes(found)
    entries = await list_output_files(db, list(indexes))
    return OutputsOut(
        items=[
            OutputFileOut(
                kernel=indexes[e.kernel_id],
                kernel_id=e.kernel_id,
                name=e.name,
                size_bytes=e.size_bytes,
            )
            for e in sorted(entries, key=lambda e: (indexes[e.kernel_id], e.name))
        ]
    )


@router.get(
    "/{session_id}/outputs/archive",
    response_class=Response,
    responses={200: {"content": {ARCHIVE_TYPE: {}}, "description": "every output, as tar.gz"}},
    operation_id="download_session_outputs",
)
async def download_outputs(session_id: uuid.UUID, user: CurrentUser, db: Db) -> Response:
    """Every output file of the session as one tar.gz (`kernel-<index>/` folders if several)."""
    found = await _visible(db, user, session_id)
    indexes = _indexes(found)
    entries = await list_output_files(db, list(indexes))
    files = []
    for entry in entries:
        data = await read_output_file(db, entry.kernel_id, entry.name)
        if data is not None:
            files.append((_archived_name(entry, indexes, len(indexes) > 1), data))
    archive = await asyncio.to_thread(_pack, files)
    filename = f"{session_id}-outputs.tar.gz"
    headers = {"Content-Disposition": f'attachment; filename="{filename}"'}
    return Response(archive, media_type=ARCHIVE_TYPE, headers=headers)


@router.get(
    "/{session_id}/outputs/{kernel}/{name:path}",
    response_class=Response,
    responses={200: {"content": {"application/octet-stream": {}}, "description": "the file"}},
    operation_id="download_session_output",
)
async def download_output(
    session_id: uuid.UUID,
    kernel: Annotated[int, Path(ge=0, description="the kernel's cluster index")],
    name: str,
    user: CurrentUser,
    db: Db,
) -> Response:
    """One output file of one kernel, as it wrote it."""
    found = await _visible(db, user, session_id)
    chosen = kernel_at(found, kernel)
    data = None if chosen is None else await read_output_file(db, KernelId(chosen["id"]), name)
    if data is None:
        raise Problem(
            404,
            "output-not-found",
            "No such output file",
            f"kernel {kernel} of session {session_id} left no output file {name!r}; list them "
            f"with GET /v1/sessions/{session_id}/outputs",
        )
    return Response(data, media_type="application/octet-stream")


def _indexes(found: Mapping[str, Any]) -> dict[KernelId, int]:
    return {KernelId(k["id"]): int(k["cluster_index"]) for k in found["kernels"]}


def _archived_name(entry: OutputEntry, indexes: Mapping[KernelId, int], several: bool) -> str:
    return f"kernel-{indexes[entry.kernel_id]}/{entry.name}" if several else entry.name


def _pack(files: list[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), now, 0o644
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()
