"""Drop the schema no code writes: the `tasks` table, job states RESIZING and CHECKPOINTING, intent kind
`relaunch`.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23

Nothing ever inserted a task (the Slurm backend tracks a job's allocation, not its steps), set a job to
RESIZING/CHECKPOINTING (a resize is applied within one tick, the job stays RUNNING or PENDING) or planned a
`relaunch` intent (a relaunch is how the backend carries out a `resize` intent: an event kind, kept). A
row with a removed value could only have been written by hand; it becomes the nearest live value (RUNNING,
`resize`) before the CHECK constraints are narrowed.

Enumerations are VARCHAR + CHECK, so narrowing one replaces the CHECK constraint: two ALTERs on PostgreSQL,
a table rebuild on SQLite (Alembic's batch mode). The rebuild must run with foreign keys off (dropping the
old `jobs` would otherwise delete every row referencing a job), which `dl2d.db.engine.upgrade` ensures, and
without the views that read the table (the rename back fails while they are dangling), which are set
aside and created again verbatim.
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from dl2d.db.schema_change import replace_check, require_sqlite_foreign_keys_off, views_set_aside


revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JOB_STATES = ("PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED")
JOB_STATES_0001 = ("PENDING", "RUNNING", "RESIZING", "CHECKPOINTING", "COMPLETED", "FAILED", "CANCELLED")
INTENT_KINDS = ("resize", "submit", "cancel")
INTENT_KINDS_0001 = ("resize", "relaunch", "submit", "cancel")


def upgrade() -> None:
    bind = op.get_bind()
    require_sqlite_foreign_keys_off(bind, "0003", "jobs")
    op.drop_index("ix_tasks_job_role_index", table_name="tasks")
    op.drop_index(op.f("ix_tasks_node"), table_name="tasks")
    op.drop_table("tasks")
    bind.exec_driver_sql("UPDATE jobs SET state = 'RUNNING' WHERE state IN ('RESIZING', 'CHECKPOINTING')")
    bind.exec_driver_sql("UPDATE intents SET kind = 'resize' WHERE kind = 'relaunch'")
    with views_set_aside(bind):
        replace_check("jobs", "job_state", "state", JOB_STATES)
        replace_check("intents", "intent_kind", "kind", INTENT_KINDS)


def downgrade() -> None:
    bind = op.get_bind()
    require_sqlite_foreign_keys_off(bind, "0003", "jobs")
    with views_set_aside(bind):
        replace_check("intents", "intent_kind", "kind", INTENT_KINDS_0001)
        replace_check("jobs", "job_state", "state", JOB_STATES_0001)
    # as in 0001
    op.create_table('tasks',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=False),
    sa.Column('role', sa.Enum('worker', 'ps', name='task_role', native_enum=False, create_constraint=True, length=16), nullable=False),
    sa.Column('index', sa.Integer(), nullable=False),
    sa.Column('node', sa.String(length=128), nullable=True),
    sa.Column('state', sa.Enum('PENDING', 'RUNNING', 'COMPLETED', 'FAILED', 'CANCELLED', name='task_state', native_enum=False, create_constraint=True, length=16), nullable=False),
    sa.Column('slurm_job_id', sa.String(length=32), nullable=True),
    sa.Column('slurm_step_id', sa.String(length=32), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_tasks_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tasks'))
    )
    op.create_index('ix_tasks_job_role_index', 'tasks', ['job_id', 'role', 'index'])
    op.create_index(op.f('ix_tasks_node'), 'tasks', ['node'])
