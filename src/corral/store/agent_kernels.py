"""The kernels of an agent, found through `agent_kernels` rather than an index on the kernels.

`agent_kernels` holds a row (agent, kernel) for every kernel that has an agent: written by the
placement that gives the kernel its agent, deleted when the kernel goes back to PENDING or is
removed with its session. Queries by agent select kernels through it, and still check
`kernels.agent_id`, so a row is never the only word on where a kernel is.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.store._sql import IdBatch, id_batch, in_param, in_values
from corral.store.database import Dialect
from corral.store.tables import agent_kernels, kernels


def on_agents(
    dialect: Dialect, agent_ids: str | IdBatch | Collection[str]
) -> sa.ColumnElement[bool]:
    """Kernels whose agent is one of `agent_ids`: ids, an `IdBatch`, or a parameter name.

    A parameter name (a `str`) makes the condition take the ids at execution, for a statement
    built once (see `in_param`).
    """
    if isinstance(agent_ids, str):
        placed = in_param(dialect, agent_kernels.c.agent_id, agent_ids)
        current = in_param(dialect, kernels.c.agent_id, agent_ids)
    else:
        batch = agent_ids if isinstance(agent_ids, IdBatch) else id_batch(dialect, agent_ids)
        placed = in_values(dialect, agent_kernels.c.agent_id, batch)
        current = in_values(dialect, kernels.c.agent_id, batch)
    return sa.and_(kernels.c.id.in_(sa.select(agent_kernels.c.kernel_id).where(placed)), current)


def on_agent(agent_id: str) -> sa.ColumnElement[bool]:
    """Kernels whose agent is `agent_id`."""
    return sa.and_(
        kernels.c.id.in_(
            sa.select(agent_kernels.c.kernel_id).where(agent_kernels.c.agent_id == agent_id)
        ),
        kernels.c.agent_id == agent_id,
    )


async def forget_agents(
    conn: AsyncConnection, scope: sa.ColumnElement[bool], **params: Any
) -> None:
    """Delete the rows of the kernels in `scope` that have an agent (before it is taken away)."""
    await conn.execute(forgetting(scope), params)


def forgetting(scope: sa.ColumnElement[bool]) -> sa.Delete:
    """`forget_agents`' statement, for a caller that builds it once (e.g. a `DirectStatement`
    over a scope taking its values as parameters)."""
    return agent_kernels.delete().where(
        sa.tuple_(agent_kernels.c.agent_id, agent_kernels.c.kernel_id).in_(
            sa.select(kernels.c.agent_id, kernels.c.id).where(
                scope, kernels.c.agent_id.is_not(None)
            )
        )
    )
