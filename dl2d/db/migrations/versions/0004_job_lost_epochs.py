"""A job's lost work: `jobs.lost_epochs`, the epochs it trained and had to redo because a restart found no
checkpoint holding them (it did not save on the checkpoint signal in time and was killed, or it crashed).
Reported by the job itself (docs/jobs.md: `lost_steps` in its progress), shown by `dl2ctl show`.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("lost_epochs", sa.Double(), nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("jobs", "lost_epochs")  # SQLite >= 3.35 drops a column in place
