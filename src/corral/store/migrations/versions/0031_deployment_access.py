"""Serving access: who the proxy lets through to a deployment.

`deployments.access` ('open' or 'token') and `deployments.token_hash` (the SHA-256 of the
deployment's token, like users' tokens; NULL for an open deployment). Deployments written
before this migration were served to anyone, so they stay 'open'. Plain ALTER TABLE.

Revision ID: 0031
Revises: 0030
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "deployments",
        sa.Column("access", sa.String(16), nullable=False, server_default="open"),
    )
    op.add_column("deployments", sa.Column("token_hash", sa.String(64), nullable=True))


def downgrade() -> None:
    op.drop_column("deployments", "token_hash")
    op.drop_column("deployments", "access")
