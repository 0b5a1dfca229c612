"""What migrations that change an enumeration share. Enumerations are VARCHAR + CHECK (dl2d.db.models._enum),
so changing one replaces its CHECK constraint: an ALTER on PostgreSQL, a table rebuild on SQLite (Alembic's
batch mode), which must run with foreign keys off (dropping the old table would otherwise delete every row
referencing it; dl2d.db.engine.upgrade/downgrade turn them off) and without the views that read the table (the
rename back fails while they dangle; they are set aside and created again verbatim)."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import sqlalchemy as sa
from alembic import op


def replace_check(table: str, enum_name: str, column: str, values: Sequence[str]) -> None:
    """The enum's CHECK constraint (named by the models' convention ck_<table>_<enum>) allowing `values`."""
    name = op.f(f"ck_{table}_{enum_name}")
    allowed = ", ".join(f"'{v}'" for v in values)
    with op.batch_alter_table(table) as batch:  # SQLite: a rebuild; PostgreSQL: ALTER TABLE in place
        batch.drop_constraint(name, type_="check")
        batch.create_check_constraint(name, f"{column} IN ({allowed})")


def require_sqlite_foreign_keys_off(bind: sa.Connection, revision: str, table: str) -> None:
    if bind.dialect.name == "sqlite" and bind.exec_driver_sql("PRAGMA foreign_keys").scalar():
        raise RuntimeError(f"migration {revision} rebuilds the {table} table and must run with foreign keys off, or "
                           f"the rebuild deletes every row that references it: migrate with "
                           "dl2d.db.engine.upgrade()/downgrade(), which turn them off")


@contextmanager
def views_set_aside(bind: sa.Connection) -> Iterator[None]:
    """SQLite: drop every view, and create them again, in their order and verbatim, after the body."""
    if bind.dialect.name != "sqlite":
        yield
        return
    views = bind.exec_driver_sql("SELECT name, sql FROM sqlite_master WHERE type = 'view' ORDER BY rowid").all()
    for name, _ in reversed(views):
        bind.exec_driver_sql(f'DROP VIEW "{name}"')
    yield
    for _, sql in views:
        bind.exec_driver_sql(sql)
