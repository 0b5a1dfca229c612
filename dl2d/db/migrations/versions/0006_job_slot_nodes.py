"""`job_slot_stats.nodes`: how many nodes a job's tasks spanned in the slot (the backend's view at the slot's
end), so that `dl2ctl calibrate` can tell a job packed on the fewest nodes from one spread over more
(dl2d.workload.calibration). NULL for the rows before it and where the backend named no node.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("job_slot_stats", sa.Column("nodes", sa.Integer(), nullable=True))


def downgrade() -> None:
    # in place (SQLite >= 3.35, PostgreSQL): a batch copy of the table would trip over the view that reads it
    op.drop_column("job_slot_stats", "nodes")
