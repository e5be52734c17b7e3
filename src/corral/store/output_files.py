"""Reading back the files kernels left in their output directories (`CORRAL_OUTPUT_DIR`).

Agents upload them once a kernel ended (`kernel_logs.store_outputs`); users list and download
them per session (`/v1/sessions/{id}/outputs`).
"""

from __future__ import annotations

from collections.abc import Collection

import sqlalchemy as sa

from corral.domain.record import record
from corral.domain.types import KernelId
from corral.store._sql import in_values
from corral.store.database import Database
from corral.store.tables import kernel_outputs


@record
class OutputEntry:
    """One output file of a kernel, without its bytes."""

    kernel_id: KernelId
    name: str  # relative to the output directory, '/'-separated
    size_bytes: int


async def list_output_files(db: Database, kernel_ids: Collection[KernelId]) -> list[OutputEntry]:
    """The output files of these kernels, by kernel and name."""
    if not kernel_ids:
        return []
    async with db.read() as conn:
        rows = await conn.execute(
            sa.select(
                kernel_outputs.c.kernel_id, kernel_outputs.c.name, kernel_outputs.c.size_bytes
            )
            .where(in_values(db.dialect, kernel_outputs.c.kernel_id, set(kernel_ids)))
            .order_by(kernel_outputs.c.kernel_id, kernel_outputs.c.name)
        )
        return [OutputEntry(KernelId(kid), name, size) for kid, name, size in rows]


async def read_output_file(db: Database, kernel_id: KernelId, name: str) -> bytes | None:
    """One output file's bytes, or None when the kernel left no file of that name."""
    async with db.read() as conn:
        data = await conn.scalar(
            sa.select(kernel_outputs.c.data).where(
                kernel_outputs.c.kernel_id == kernel_id, kernel_outputs.c.name == name
            )
        )
    return None if data is None else bytes(data)
