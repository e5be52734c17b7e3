"""The kernel restart policy (issue 36): how often each kernel was restarted, and whether it is
being restarted now.

`kernels.restarts` counts the restarts its agents reported (the session's `restart_limit` in its
spec bounds them); `kernels.restarting` is true from the report that the kernel went down to
the one that it runs again, so a session is ready again only once none of its kernels is.
Plain ALTER TABLE with constant defaults (no table rewrite on PostgreSQL).

Revision ID: 0032
Revises: 0031
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0032"
down_revision = "0031"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "kernels", sa.Column("restarts", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column(
        "kernels",
        sa.Column("restarting", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    op.drop_column("kernels", "restarting")
    op.drop_column("kernels", "restarts")
