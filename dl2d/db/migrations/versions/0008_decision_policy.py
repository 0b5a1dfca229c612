"""`decisions.policy`: the name of the policy in charge of the slot (the daemon's configured policy, e.g. `drf`,
`dl2-target`, `elastic+dltap`; it changes at a reload), whether it or the guardrails' fallback decided
(`source`). Without it the decisions before and after a reload cannot be told apart. NULL for the rows before
it. `v_decision_sources` gains the column, as `report.sql`'s `decision_sources` does, the name first; a NULL
name shows as `(not recorded)`.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""
from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

DECISION_SOURCES_0001 = """
        SELECT source, COUNT(*) AS n_decisions,
               1.0 * COUNT(*) / (SELECT COUNT(*) FROM decisions) AS share,
               AVG(latency_ms) AS avg_latency_ms
        FROM decisions GROUP BY source"""
DECISION_SOURCES = """
        SELECT COALESCE(policy, '(not recorded)') AS policy, source, COUNT(*) AS n_decisions,
               1.0 * COUNT(*) / (SELECT COUNT(*) FROM decisions) AS share,
               AVG(latency_ms) AS avg_latency_ms
        FROM decisions GROUP BY COALESCE(policy, '(not recorded)'), source"""


def _replace_view(body: str) -> None:
    bind = op.get_bind()
    bind.exec_driver_sql("DROP VIEW IF EXISTS v_decision_sources")
    bind.exec_driver_sql(f"CREATE VIEW v_decision_sources AS {body}")


def upgrade() -> None:
    op.add_column("decisions", sa.Column("policy", sa.Text(), nullable=True))
    _replace_view(DECISION_SOURCES)


def downgrade() -> None:
    _replace_view(DECISION_SOURCES_0001)  # first: SQLite drops no column a view still reads
    # in place (SQLite >= 3.35, PostgreSQL): a batch copy of the table would trip over the views that read it
    op.drop_column("decisions", "policy")
