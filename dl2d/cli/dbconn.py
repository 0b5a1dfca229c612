"""How `dl2ctl`'s job commands find and open the daemon's database, and who is calling.

The database URL is, in order: `--db URL`, the `DL2D_DB_URL` environment variable, the daemon config file
(`$DL2D_CONFIG` or `/etc/dl2d/dl2d.toml`; its `db_url`, `[db] url` or `[database] url`, else its
`state_dir`), else the default SQLite file `<state dir>/dl2d.sqlite` where the state dir is
`$DL2D_STATE_DIR` or `/var/lib/dl2d`. `resolve_db_url` is the pure part of that rule.

A database without a schema (a new SQLite file, an empty PostgreSQL database) is created at the newest
migration. An existing schema is left alone: migrating it is the daemon's job (it upgrades at start), and
a CLI must not change the schema under a running daemon.

Admins: root (uid 0) and the members of the unix group `dl2d-admin` (or the group named by `admin_group`
in the config file) may cancel any job and submit on behalf of another user.
"""
from __future__ import annotations

import functools
import os
import pwd
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

DEFAULT_CONFIG = "/etc/dl2d/dl2d.toml"
DEFAULT_STATE_DIR = "/var/lib/dl2d"
DEFAULT_ADMIN_GROUP = "dl2d-admin"


class ConfigError(click.ClickException):
    pass


def load_config(path: str | Path) -> dict[str, Any]:
    """The daemon config file as a dict; {} when the file does not exist; ConfigError when it is unreadable."""
    from dl2d.core.files import TomlFileError, read_toml_file

    try:
        doc = read_toml_file(path)
    except TomlFileError as e:
        raise ConfigError(f"config file: {e}") from None
    return doc if doc is not None else {}


def _section_get(cfg: Mapping[str, Any], *path: str) -> Any:
    cur: Any = cfg
    for key in path:
        if not isinstance(cur, Mapping) or key not in cur:
            return None
        cur = cur[key]
    return cur


def resolve_db_url(flag: str | None, env: Mapping[str, str], config: Mapping[str, Any]) -> str:
    """The database URL from the flag, the environment, the config file or the default (see module doc)."""
    from dl2d.db.engine import default_url

    if flag:
        return flag
    if env.get("DL2D_DB_URL"):
        return env["DL2D_DB_URL"]
    for path in (("db_url",), ("db", "url"), ("database", "url"), ("daemon", "db_url")):
        v = _section_get(config, *path)
        if v is not None:
            if not isinstance(v, str) or not v:
                raise ConfigError(f"config key {'.'.join(path)} must be a non-empty string, got {v!r}")
            return v
    state_dir = env.get("DL2D_STATE_DIR") or _section_get(config, "state_dir") \
        or _section_get(config, "daemon", "state_dir") or DEFAULT_STATE_DIR
    return default_url(state_dir)


def admin_group(config: Mapping[str, Any]) -> str:
    g = _section_get(config, "admin_group") or _section_get(config, "daemon", "admin_group")
    return g if isinstance(g, str) and g else DEFAULT_ADMIN_GROUP


def current_user() -> str:
    """The unix user running dl2ctl, from the effective uid (not $USER, which anyone can set)."""
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid without a passwd entry (containers)
        return "root" if uid == 0 else str(uid)


def is_admin(user: str, group: str = DEFAULT_ADMIN_GROUP) -> bool:
    """root, or a member (primary or supplementary) of `group`."""
    if user == "root":
        return True
    import grp

    try:
        g = grp.getgrnam(group)
    except KeyError:
        return False
    if user in g.gr_mem:
        return True
    try:
        return pwd.getpwnam(user).pw_gid == g.gr_gid
    except KeyError:
        return False


class Ctx:
    """What the job commands share: the resolved URL, the config and the caller."""

    def __init__(self, url: str, config: Mapping[str, Any]):
        self.url = url
        self.config = config
        self.user = current_user()
        self.admin = is_admin(self.user, admin_group(config))

    def engine(self):
        """An engine on the database, creating the schema when the database has none."""
        return open_db(self.url)

    @contextmanager
    def reading(self):
        """Turn database errors inside the block into a clear message (exit 1)."""
        from sqlalchemy.exc import DBAPIError

        try:
            yield
        except DBAPIError as e:
            raise click.ClickException(
                f"database error on {_shown(self.url)}: {e.orig} (if the schema is older than this dl2ctl, "
                "start the daemon, which migrates it)") from e


def _shown(url: str) -> str:
    """The URL with its password hidden."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string()
    except Exception:
        return url


def open_db(url: str):
    from sqlalchemy import inspect
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, DBAPIError

    from dl2d.db.engine import make_engine, upgrade

    try:
        u = make_url(url)
    except ArgumentError as e:
        raise click.ClickException(f"invalid database URL {url!r}: {e}") from e
    shown = u.render_as_string()
    if u.get_backend_name() == "sqlite" and u.database not in (None, "", ":memory:"):
        parent = Path(u.database).parent
        if not parent.is_dir():
            raise click.ClickException(
                f"no directory {parent} for the database {u.database} (is dl2d installed here? "
                "give --db URL or set DL2D_DB_URL)")
    try:
        engine = make_engine(url)
    except Exception as e:  # a missing driver, e.g. psycopg for postgresql+psycopg://
        raise click.ClickException(f"cannot open the database {shown}: {e}") from e
    try:
        with engine.connect() as conn:
            new = not inspect(conn).has_table("alembic_version")
        if new:
            upgrade(engine)
    except DBAPIError as e:
        engine.dispose()
        raise click.ClickException(f"cannot open the database {shown}: {e.orig}") from e
    return engine


def db_command(fn: Callable) -> Callable:
    """Add `--db URL` to a command and pass it a `Ctx` as first argument."""

    @click.option("--db", "db_url", metavar="URL",
                  help="Database URL, e.g. sqlite:////var/lib/dl2d/dl2d.sqlite or postgresql+psycopg://... "
                       "[default: $DL2D_DB_URL, else the db_url of $DL2D_CONFIG or /etc/dl2d/dl2d.toml, "
                       "else <$DL2D_STATE_DIR or /var/lib/dl2d>/dl2d.sqlite]")
    @functools.wraps(fn)
    def wrapper(db_url: str | None, **kwargs):
        config = load_config(os.environ.get("DL2D_CONFIG") or DEFAULT_CONFIG)
        ctx = Ctx(resolve_db_url(db_url, os.environ, config), config)
        return fn(ctx, **kwargs)

    return wrapper
