"""Signed-in dashboards: `dashboard_sessions`, a random secret's hash per signed-in browser,
bound to its user and the API token that signed in (both cascade), with an expiry.

The dashboard's cookie held the API token itself; it now holds only this session's secret.

Revision ID: 0030
Revises: 0029
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dashboard_sessions",
        sa.Column("secret_hash", sa.String(length=64), nullable=False),
        sa.Column("user_id", sa.Uuid(), nullable=False),
        sa.Column("token_id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["user_id"],
            ["users.id"],
            name=op.f("fk_dashboard_sessions_user_id_users"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["token_id"],
            ["api_tokens.id"],
            name=op.f("fk_dashboard_sessions_token_id_api_tokens"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("secret_hash", name=op.f("pk_dashboard_sessions")),
    )
    for column in ("user_id", "token_id", "expires_at"):
        op.create_index(f"ix_dashboard_sessions_{column}", "dashboard_sessions", [column])


def downgrade() -> None:
    op.drop_table("dashboard_sessions")
