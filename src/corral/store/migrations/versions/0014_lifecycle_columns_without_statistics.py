"""PostgreSQL: no planner statistics for the columns that move with the lifecycle.

A session's and a kernel's status, a kernel's agent and its desired state change within
seconds of each other, so statistics taken at one moment soon describe another: taken while
the sessions just submitted were all PENDING and unplaced, they told the planner that no row
was SCHEDULED and none had an agent. Every guarded write joins a batch of ids with such a
filter (`key IN (SELECT unnest(:ids)) AND status = ...`), and expecting one row the planner
compared each id with each row in a nested loop: 4,000 kernels moved in 0.58 s instead of
0.05 s, 8,000 sessions locked in 3.9 s, and runs of `corral simulate` on PostgreSQL varied by
40 % with the moment the tables were analyzed (auto_explain).

Without statistics for a column, the planner assumes that an equality on it keeps a small
share of the rows (0.5 %), never none: it drives such a join from the ids through the index on
the key, a lookup per id. Loads by status still use the status index. ALTER ... TYPE to the
column's own type drops the statistics already gathered; SET STATISTICS 0 keeps ANALYZE from
gathering them again. SQLite plans without such statistics.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-25
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# (table, column, its type)
LIFECYCLE_COLUMNS = (
    ("sessions", "status", "corral_session_status"),
    ("kernels", "status", "corral_kernel_status"),
    ("kernels", "agent_id", "VARCHAR(64)"),
    ("kernels", "desired_state", "VARCHAR(16)"),
)


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column, type_ in LIFECYCLE_COLUMNS:
        op.execute(
            f"ALTER TABLE {table} ALTER COLUMN {column} SET STATISTICS 0,"
            f" ALTER COLUMN {column} TYPE {type_}"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column, _type in LIFECYCLE_COLUMNS:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET STATISTICS -1")
