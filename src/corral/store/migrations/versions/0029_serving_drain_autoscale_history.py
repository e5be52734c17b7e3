"""Serving: history per deployment and route, draining, proxies' load reports, autoscaling.

`deployment_history` and `route_history` (one row per handler outcome, SUCCESS / FAILURE /
STALE, folded like the sessions' history); `routes.drain_until` (a replica being taken out
gets no new requests and ends when its requests in flight end or at this time);
`proxy_reports` (each proxy's requests in flight per replica, and the route table revision it
forwards by); `deployments.autoscale_wanted` / `autoscale_since` (the replica count the
autoscaler has recommended, and since when, against its delays).

Revision ID: 0029
Revises: 0028
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), "postgresql")
BigID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def _history_columns() -> list[sa.Column[object]]:
    return [
        sa.Column("phase", sa.String(length=64), nullable=False),
        sa.Column("from_status", sa.String(length=16), nullable=True),
        sa.Column("to_status", sa.String(length=16), nullable=True),
        sa.Column("result", sa.String(length=16), nullable=False),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("message", sa.Text(), server_default="", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default="1", nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "deployment_history",
        sa.Column("id", BigID, autoincrement=True, nullable=False),
        sa.Column("deployment_id", sa.Uuid(), nullable=False),
        *_history_columns(),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_deployment_history")),
    )
    op.create_index(
        op.f("ix_deployment_history_deployment_id_id"),
        "deployment_history",
        ["deployment_id", "id"],
    )
    op.create_table(
        "route_history",
        sa.Column("id", BigID, autoincrement=True, nullable=False),
        sa.Column("route_id", sa.Uuid(), nullable=False),
        sa.Column("deployment_id", sa.Uuid(), nullable=False),
        *_history_columns(),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_route_history")),
    )
    op.create_index(op.f("ix_route_history_route_id_id"), "route_history", ["route_id", "id"])
    op.create_index(
        op.f("ix_route_history_deployment_id_id"), "route_history", ["deployment_id", "id"]
    )
    op.create_table(
        "proxy_reports",
        sa.Column("proxy_id", sa.String(length=64), nullable=False),
        sa.Column("table_revision", sa.BigInteger(), nullable=False),
        sa.Column("inflight", JSON, nullable=False),
        sa.Column("reported_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("proxy_id", name=op.f("pk_proxy_reports")),
    )
    op.add_column("routes", sa.Column("drain_until", sa.DateTime(timezone=True), nullable=True))
    op.add_column("deployments", sa.Column("autoscale_wanted", sa.Integer(), nullable=True))
    op.add_column(
        "deployments", sa.Column("autoscale_since", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("deployments", "autoscale_since")
    op.drop_column("deployments", "autoscale_wanted")
    op.drop_column("routes", "drain_until")
    op.drop_table("proxy_reports")
    op.drop_index(op.f("ix_route_history_deployment_id_id"), table_name="route_history")
    op.drop_index(op.f("ix_route_history_route_id_id"), table_name="route_history")
    op.drop_table("route_history")
    op.drop_index(op.f("ix_deployment_history_deployment_id_id"), table_name="deployment_history")
    op.drop_table("deployment_history")
