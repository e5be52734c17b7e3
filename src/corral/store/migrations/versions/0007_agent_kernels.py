"""The kernels of each agent in a table of their own; `kernels.agent_id` no longer indexed.

With `agent_id` indexed, placing a kernel changed an indexed column, so PostgreSQL could not
make it a HOT update: the whole row was copied to a new place and an entry written in each of
the table's three indexes. Placing 40,000 kernels took ~330 ms of the server's time for the
UPDATE alone. Now the placement's UPDATE can be HOT, and a narrow (agent, kernel) row is
inserted.

Pages are also kept 60 % empty (they were half): a placement makes each row longer (its agent,
its occupied slots), and half a page did not hold the new versions of all the rows of the
other half, so a quarter of the placements of a batch were still full updates.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "agent_kernels",
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("kernel_id", sa.Uuid(), nullable=False),
        sa.PrimaryKeyConstraint("agent_id", "kernel_id", name=op.f("pk_agent_kernels")),
        sqlite_with_rowid=False,
    )
    op.execute(
        "INSERT INTO agent_kernels (agent_id, kernel_id) "
        "SELECT agent_id, id FROM kernels WHERE agent_id IS NOT NULL"
    )
    with op.batch_alter_table("kernels", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_kernels_agent_id"))
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE kernels SET (fillfactor = 40)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE kernels SET (fillfactor = 50)")
    with op.batch_alter_table("kernels", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_kernels_agent_id"), ["agent_id"], unique=False)
    op.drop_table("agent_kernels")
