"""Per-job slot measurements (job_slot_stats), decisions.job_flags, and the v_job_speed report view.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Per job over all its measured slots; the speed in epochs per hour, GPU memory in GiB.
V_JOB_SPEED = """
SELECT j.id AS job_id, j.name AS name, j.job_type AS job_type,
       COUNT(*) AS n_slots,
       AVG(s.epochs_per_s) * 3600.0 AS avg_epochs_per_h,
       AVG(s.predicted_epochs_per_s) * 3600.0 AS avg_predicted_epochs_per_h,
       AVG(s.speed_factor) AS avg_speed_factor,
       MIN(s.speed_factor) AS min_speed_factor,
       AVG(s.gpu_util_mean_pct) AS avg_gpu_util,
       MAX(s.gpu_mem_per_gpu_max_bytes) / 1073741824.0 AS max_gpu_mem_gib,
       SUM(CASE WHEN s.shared_gpu THEN 1 ELSE 0 END) AS n_shared_slots
FROM job_slot_stats s JOIN jobs j ON j.id = s.job_id
GROUP BY j.id, j.name, j.job_type
"""


def upgrade() -> None:
    op.create_table('job_slot_stats',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('slot_id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=False),
    sa.Column('workers', sa.Integer(), nullable=False),
    sa.Column('ps', sa.Integer(), nullable=False),
    sa.Column('epochs', sa.Double(), nullable=False),
    sa.Column('epochs_per_s', sa.Double(), nullable=False),
    sa.Column('predicted_epochs_per_s', sa.Double(), nullable=True),
    sa.Column('speed_factor', sa.Double(), nullable=True),
    sa.Column('ended', sa.Boolean(), nullable=False),
    sa.Column('gpus', sa.Integer(), nullable=True),
    sa.Column('gpu_util_mean_pct', sa.Double(), nullable=True),
    sa.Column('gpu_mem_per_gpu_max_bytes', sa.Double(), nullable=True),
    sa.Column('shared_gpu', sa.Boolean(), nullable=True),
    sa.Column('gpu_observations', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_job_slot_stats_job_id_jobs'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['slot_id'], ['slots.id'], name=op.f('fk_job_slot_stats_slot_id_slots'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_job_slot_stats')),
    sa.UniqueConstraint('slot_id', 'job_id', name=op.f('uq_job_slot_stats_slot_id_job_id'))
    )
    op.create_index(op.f('ix_job_slot_stats_job_id'), 'job_slot_stats', ['job_id'])
    op.add_column('decisions', sa.Column('job_flags', sa.JSON(), nullable=True))
    op.get_bind().exec_driver_sql(f"CREATE VIEW v_job_speed AS {V_JOB_SPEED}")


def downgrade() -> None:
    op.get_bind().exec_driver_sql("DROP VIEW IF EXISTS v_job_speed")
    # plain ALTER TABLE ... DROP COLUMN (SQLite >= 3.35, PostgreSQL): a batch copy of `decisions` would
    # trip over the 0001 views that read it
    op.get_bind().exec_driver_sql("ALTER TABLE decisions DROP COLUMN job_flags")
    op.drop_index(op.f('ix_job_slot_stats_job_id'), table_name='job_slot_stats')
    op.drop_table('job_slot_stats')
