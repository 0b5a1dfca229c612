"""A job's batch: `jobs.batch_size`, the total batch an adaptive job (`adaptive_batch` in its spec) was last
started at by dl2d (NULL: its submitted one), and `jobs.batch_noise`, what dl2d has learned of its gradient noise
from its own reports (dl2d.workload.efficiency.NoiseFit as JSON; NULL: none yet). Shown by `dl2ctl show`.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("batch_size", sa.Double(), nullable=True))
    op.add_column("jobs", sa.Column("batch_noise", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "batch_noise")  # SQLite >= 3.35 drops a column in place
    op.drop_column("jobs", "batch_size")
