"""Removing ended sessions with everything recorded about them: by a user, or by retention.

`corral session rm` (one session, or a job array's elements) and the retention task both end
in `remove_sessions`, in the caller's transaction: the kernels, their logs and outputs, the
session and kernel history, the dependencies both ways, the agents' records of the kernels,
and the sessions. A user's removal keeps the events (the audit log); retention forgets them.
"""

from __future__ import annotations

from collections.abc import Collection

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from corral.domain.events import SESSION_ENTITY
from corral.domain.status import SESSION_TERMINAL
from corral.domain.types import SessionId
from corral.store._sql import in_values
from corral.store.agent_kernels import forget_agents
from corral.store.database import Dialect
from corral.store.tables import (
    events,
    kernel_history,
    kernel_logs,
    kernel_outputs,
    kernels,
    session_dependencies,
    session_history,
    sessions,
)

ENDED = tuple(s.value for s in SESSION_TERMINAL)


async def remove_sessions(
    conn: AsyncConnection, dialect: Dialect, ids: Collection[SessionId], *, with_events: bool
) -> None:
    """Delete the sessions `ids` and everything recorded about them, in the caller's
    transaction (the caller has checked that they ended and nothing waits on them)."""
    if not ids:
        return
    ids = list(ids)
    of_sessions = in_values(dialect, kernels.c.session_id, ids)
    kernel_ids = sa.select(kernels.c.id).where(of_sessions)
    await conn.execute(kernel_logs.delete().where(kernel_logs.c.kernel_id.in_(kernel_ids)))
    await conn.execute(kernel_outputs.delete().where(kernel_outputs.c.kernel_id.in_(kernel_ids)))
    await conn.execute(
        kernel_history.delete().where(in_values(dialect, kernel_history.c.session_id, ids))
    )
    await conn.execute(
        session_history.delete().where(in_values(dialect, session_history.c.session_id, ids))
    )
    await conn.execute(
        session_dependencies.delete().where(
            sa.or_(
                in_values(dialect, session_dependencies.c.session_id, ids),
                in_values(dialect, session_dependencies.c.depends_on, ids),
            )
        )
    )
    if with_events:
        await conn.execute(
            events.delete().where(
                events.c.entity_type == SESSION_ENTITY,
                in_values(dialect, events.c.entity_id, [str(sid) for sid in ids]),
            )
        )
    await forget_agents(conn, of_sessions)
    await conn.execute(kernels.delete().where(of_sessions))
    await conn.execute(
        sessions.update()
        .where(in_values(dialect, sessions.c.parent_session_id, ids))
        .values(parent_session_id=None)
    )
    await conn.execute(sessions.delete().where(in_values(dialect, sessions.c.id, ids)))


async def waiting_dependants(
    conn: AsyncConnection, dialect: Dialect, ids: Collection[SessionId]
) -> int:
    """How many sessions outside `ids` that have not ended depend on one of `ids`."""
    dependant = sa.alias(sessions, "dependant")
    found = await conn.scalar(
        sa.select(sa.func.count())
        .select_from(
            session_dependencies.join(
                dependant, dependant.c.id == session_dependencies.c.session_id
            )
        )
        .where(
            in_values(dialect, session_dependencies.c.depends_on, list(ids)),
            dependant.c.status.not_in(ENDED),
            ~in_values(dialect, dependant.c.id, list(ids)),
        )
    )
    return int(found or 0)
