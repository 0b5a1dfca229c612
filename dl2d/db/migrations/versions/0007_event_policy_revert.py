"""Event kind `policy_revert`: the online learner's parameters put back to the last good ones (the revert rule
of dl2d.policy.target.online), with the reason in the event's detail. Downgrading deletes those events.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""
from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from dl2d.db.schema_change import (
    replace_check,
    require_sqlite_foreign_keys_off,
    views_set_aside,
)

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

EVENT_KINDS_0001 = ("submit", "start", "resize", "relaunch", "hot_scale", "finish", "fail", "cancel", "node_stale",
                    "node_recovered", "fallback")
EVENT_KINDS = (*EVENT_KINDS_0001, "policy_revert")


def upgrade() -> None:
    bind = op.get_bind()
    require_sqlite_foreign_keys_off(bind, "0007", "events")
    with views_set_aside(bind):
        replace_check("events", "event_kind", "kind", EVENT_KINDS)


def downgrade() -> None:
    bind = op.get_bind()
    require_sqlite_foreign_keys_off(bind, "0007", "events")
    bind.exec_driver_sql("DELETE FROM events WHERE kind = 'policy_revert'")
    with views_set_aside(bind):
        replace_check("events", "event_kind", "kind", EVENT_KINDS_0001)
