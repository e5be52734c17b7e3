"""Serving: the probe counters of a route, and the revisions of rolling updates.

`routes.consecutive_successes` (passed probes in a row, against the health check's
success_threshold) and `routes.probed_at` (when the manager last probed it: when the next probe
is due, and whether its health is stale); `deployments.revision` and `previous_spec` (the spec a
rolling update replaces, to roll back to) and `routes.revision` (the spec revision a replica
runs). Plain ALTER TABLE.

Revision ID: 0028
Revises: 0027
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "routes",
        sa.Column("consecutive_successes", sa.Integer(), nullable=False, server_default="0"),
    )
    op.add_column("routes", sa.Column("probed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("routes", sa.Column("revision", sa.Integer(), nullable=False, server_default="0"))
    op.add_column(
        "deployments", sa.Column("revision", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column("deployments", sa.Column("previous_spec", JSON, nullable=True))


def downgrade() -> None:
    op.drop_column("deployments", "previous_spec")
    op.drop_column("deployments", "revision")
    op.drop_column("routes", "revision")
    op.drop_column("routes", "probed_at")
    op.drop_column("routes", "consecutive_successes")
