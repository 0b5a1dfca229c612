"""Advise mode: `decisions.advice`, what the configured policy would have done in a slot that carried out the
`slurm` policy instead (dl2d.daemon.plan.advice_record): the policy's name and, per job, the size it advised
and the speed model's epochs/s at that size and at the size that ran. `dl2ctl report --only advice` reads it.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("decisions", sa.Column("advice", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("decisions", "advice")
