"""When the lost sweep and the kernel checks next have work: one read, for a quiet manager.

The sweep (`store.agent_registry.mark_lost_agents`, `store.kernel_checks.check_quiet_kernels`)
writes; run every heartbeat interval on an idle cluster it was two write transactions every ten
seconds, the largest share of an idle manager's CPU. This read tells the sweep whether either
has anything to do now, and the earliest moment the rows as they stand could give it some:

- an ALIVE agent is lost once its last heartbeat is older than the timeout: the oldest
  heartbeat among them says when the first could be;
- a started kernel on an ALIVE agent is asked about once its agent said nothing of it for its
  status's bound, and failed once an ask stays unanswered for the heartbeat timeout. A kernel
  went quiet at the later of its status change and its last word (`heard_at`); per status the
  read gives the oldest of each, and the later of those two is never after the first kernel of
  that status goes quiet (so the moment may come early, never late).

Rows written after the read (a kernel starting, an agent joining) are not in it: the caller
adds its own bounds for them (`controller.agents.AgentController.sweep`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from corral.domain.record import record
from corral.domain.status import KernelStatus
from corral.store._direct import DirectStatement
from corral.store.agents import AGENT_ALIVE
from corral.store.database import Database, Dialect
from corral.store.kernel_checks import CHECKED
from corral.store.tables import agents, kernels


@record
class QuietSince:
    """The started kernels of one status on ALIVE agents not asked about: the oldest status
    change and the oldest last word (a status change where there was none since)."""

    changed: datetime
    heard: datetime


@record
class SweepOutlook:
    """What the sweep could find, as of one read."""

    alive_agents: int
    oldest_heartbeat: datetime | None  # of the ALIVE agents (None: none has sent one)
    unasked: Mapping[KernelStatus, QuietSince]  # by status, where there are any
    oldest_ask: datetime | None  # of the kernels asked about and not answered


def _agents(_dialect: Dialect) -> sa.Executable:
    return sa.select(sa.func.count(), sa.func.min(agents.c.last_heartbeat_at)).where(
        agents.c.status == AGENT_ALIVE
    )


def _kernels(_dialect: Dialect) -> sa.Executable:
    k = kernels.c
    unasked = k.asked_at.is_(None)
    return (
        sa.select(
            k.status,
            unasked.label("unasked"),
            sa.func.min(k.status_changed_at),
            sa.func.min(sa.func.coalesce(k.heard_at, k.status_changed_at)),
            sa.func.min(k.asked_at),
        )
        .select_from(kernels.join(agents, agents.c.id == k.agent_id))
        .where(
            agents.c.status == AGENT_ALIVE,
            sa.or_(*(k.status == status.value for status in sorted(CHECKED))),
        )
        .group_by(k.status, unasked)
    )


_AGENTS = DirectStatement(_agents)
_KERNELS = DirectStatement(_kernels)


async def read_sweep_outlook(db: Database) -> SweepOutlook:
    """The ALIVE agents' oldest heartbeat and their started kernels' quiet moments, in one read."""
    async with db.read() as conn:
        ((count, oldest_heartbeat),) = await _AGENTS.rows(conn)
        groups: list[Any] = await _KERNELS.rows(conn) if count else []
    unasked: dict[KernelStatus, QuietSince] = {}
    oldest_ask: datetime | None = None
    for status, not_asked, changed, heard, asked in groups:
        if not_asked:
            unasked[KernelStatus(status)] = QuietSince(changed, heard)
        elif asked is not None and (oldest_ask is None or asked < oldest_ask):
            oldest_ask = asked
    return SweepOutlook(int(count), oldest_heartbeat, unasked, oldest_ask)
