"""All-or-nothing admission (spec document 2): the KernelsReady condition and requeue state.

The requeue columns (`requeue_count`, `requeue_at`, `requeue_active`, `evicted_at`) exist since
0001. This adds the KernelsReady condition of a session (`kernels_ready`, NULL while it is not
admitted; its reason and last transition time), the time of the first eviction of the current
requeue cycle (for the group's `backoff_limit_timeout_s`), the reason of the last eviction and
when the session was deactivated (for `deactivated_retention_s`). Plain ALTER TABLE, never a
batch copy of `sessions` (see 0009).

Revision ID: 0026
Revises: 0025
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

_COLUMNS = (
    ("kernels_ready", sa.Boolean()),
    ("kernels_ready_reason", sa.String(length=16)),
    ("kernels_ready_at", sa.DateTime(timezone=True)),
    ("first_evicted_at", sa.DateTime(timezone=True)),
    ("eviction_reason", sa.String(length=64)),
    ("deactivated_at", sa.DateTime(timezone=True)),
)


def upgrade() -> None:
    for name, type_ in _COLUMNS:
        op.add_column("sessions", sa.Column(name, type_, nullable=True))


def downgrade() -> None:
    for name, _ in reversed(_COLUMNS):
        op.drop_column("sessions", name)
