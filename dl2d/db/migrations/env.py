"""Alembic environment of dl2d.

Run programmatically by `dl2d.db.engine.upgrade()`, which passes an open connection in
`config.attributes["connection"]`; with only `sqlalchemy.url` set (e.g. from the alembic CLI with
`-x`/a hand-written ini) an engine is created with dl2d's settings. Either way the connection comes from
`dl2d.db.engine.migration_connection` (on SQLite: foreign keys off while tables are rebuilt).
"""
from __future__ import annotations

from alembic import context

from dl2d.db.engine import make_engine, migration_connection
from dl2d.db.models import Base

config = context.config
target_metadata = Base.metadata


def _configure(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite needs table rebuilds for ALTER
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url"))
    try:
        with migration_connection(engine) as conn:  # SQLite: foreign keys off, see its docstring
            _configure(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
