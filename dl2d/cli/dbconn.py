"""How `dl2ctl`'s job commands find and open the daemon's database, and who is calling.

The config file (`$DL2D_CONFIG` or `/etc/dl2d/dl2d.toml`) is read with the daemon's own schema
(dl2d.daemon.config.client_view: the same keys, types, environment overrides and errors), so a file the daemon
would refuse is refused here too. The database URL is, in order: `--db URL`, the `DL2D_DB_URL` environment
variable, the config's `db_url`, else the SQLite file `<state dir>/dl2d.sqlite` where the state dir is
`$DL2D_STATE_DIR`, the config's `state_dir` or `/var/lib/dl2d`. `resolve_db_url` is the pure part of that rule.

A database without a schema (a new SQLite file, an empty PostgreSQL database) is created at the newest
migration. An existing schema is left alone: migrating it is the daemon's job (it upgrades at start), and
a CLI must not change the schema under a running daemon.

Writes (`submit`, `cancel`) go to the daemon's control socket (dl2d.daemon.control), which learns the caller's
uid from the kernel and decides the rights from the daemon's own config: admins are root and the members of
its `admin_group` (`dl2d-admin` by default); they may cancel any job and submit on behalf of another user. The
socket is, in order: `$DL2D_SOCKET`, the config's `[control] socket`, `<state_dir>/dl2d.sock` where the
config or `$DL2D_STATE_DIR` names a state dir, else `/run/dl2d/dl2d.sock` where it exists (the packaged unit's),
else `/var/lib/dl2d/dl2d.sock`. `--db URL` or `$DL2D_DB_URL` means the database directly, and so does a socket
nobody answers on (the daemon is stopped): that works only for whoever may write the database itself (the
daemon's account, root), who could change anything in it anyway; the same rights are then checked here, as a
courtesy, with the config's `admin_group`. Reports (`queue`, `show`) read the database directly.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from dl2d.core.users import DEFAULT_ADMIN_GROUP, current_user, is_admin  # noqa: F401 (tests patch them here)

DEFAULT_CONFIG = "/etc/dl2d/dl2d.toml"
DEFAULT_STATE_DIR = "/var/lib/dl2d"


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


def daemon_view(env: Mapping[str, str], config: Mapping[str, Any]):
    """The daemon's config (dl2d.daemon.config's schema) from the file's table and the environment: one schema
    and one rule for the daemon and every dl2ctl command. ConfigError (exit 1) naming the key."""
    from dl2d.daemon.config import ConfigError as DaemonConfigError
    from dl2d.daemon.config import client_view

    try:
        return client_view(config, env)
    except DaemonConfigError as e:
        raise ConfigError(str(e).removeprefix("config error: ")) from None


def resolve_db_url(flag: str | None, env: Mapping[str, str], config: Mapping[str, Any]) -> str:
    """The database URL: the flag, else the daemon's (`db_url` of the environment or the file, else the SQLite
    file in its state dir)."""
    return flag or daemon_view(env, config).database_url


def state_dir_of(env: Mapping[str, str], config: Mapping[str, Any]) -> str:
    """The daemon's state dir: `$DL2D_STATE_DIR`, the config's `state_dir`, else the default."""
    return daemon_view(env, config).state_dir


#: Where the packaged unit (systemd/dl2d.service, RuntimeDirectory=dl2d) has the daemon listen.
PACKAGED_SOCKET = "/run/dl2d/dl2d.sock"


def resolve_socket(flag_db: str | None, env: Mapping[str, str], config: Mapping[str, Any],
                   packaged_exists: Callable[[], bool] = lambda: Path(PACKAGED_SOCKET).exists()) -> str | None:
    """The daemon's control socket (see the module doc); None when a database was named (direct mode)."""
    if flag_db or env.get("DL2D_DB_URL"):
        return None
    if env.get("DL2D_SOCKET"):
        return env["DL2D_SOCKET"]
    cfg = daemon_view(env, config)
    if cfg.control.socket or env.get("DL2D_STATE_DIR") or "state_dir" in config:
        return cfg.control_socket
    return PACKAGED_SOCKET if packaged_exists() else str(Path(DEFAULT_STATE_DIR) / "dl2d.sock")


def admin_group(config: Mapping[str, Any]) -> str:
    return daemon_view({}, config).admin_group or DEFAULT_ADMIN_GROUP


class Ctx:
    """What the job commands share: the resolved URL and socket, the config and the caller."""

    def __init__(self, url: str, config: Mapping[str, Any], socket: str | None = None):
        self.url = url
        self.config = config
        self.socket = socket
        self.user = current_user()
        self.admin = is_admin(self.user, admin_group(config))
        self._via_daemon: bool | None = None
        #: why no daemon answered on the socket (writes then go to the database directly); None: one did, or none
        #: was asked (a database named with --db or $DL2D_DB_URL)
        self.no_daemon: str | None = None

    def engine(self):
        """An engine on the database, creating the schema when the database has none."""
        return open_db(self.url, hint=self._direct_hint())

    def _direct_hint(self) -> str | None:
        """What to tell a caller whose direct database access failed after no daemon answered."""
        if self.socket is None:
            return None
        return (f"no dl2d answers on {self.socket}, so this went to the database directly, which only the daemon's "
                "account may write: start dl2d, or give DL2D_SOCKET")

    def via_daemon(self) -> bool:
        """Whether writes go to the daemon: a socket is named and a daemon answers on it. When it does, the user
        and admin rights are the daemon's answer (``whoami``), not this process's guess."""
        if self._via_daemon is None:
            self._via_daemon = False
            if self.socket is not None:
                from dl2d.daemon.control import NoDaemon, ask

                try:
                    me = ask(self.socket, {"op": "whoami"})
                except NoDaemon as e:
                    self.no_daemon = str(e)
                    return False
                except ConnectionError as e:
                    raise click.ClickException(str(e)) from None
                self.user, self.admin = str(me.get("user", self.user)), bool(me.get("admin"))
                self._via_daemon = True
        return self._via_daemon

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """One request to the daemon; its reply, or a clear error (exit 1) when it cannot be had or says no."""
        from dl2d.daemon.control import NoDaemon, ask

        assert self.socket is not None
        try:
            reply = ask(self.socket, request)
        except NoDaemon as e:
            raise click.ClickException(f"{e}: dl2d stopped while this request was made") from None
        except ConnectionError as e:
            raise click.ClickException(str(e)) from None
        if not reply.get("ok") and "error" in reply:
            raise click.ClickException(f"dl2d refused the request: {reply['error']}")
        return reply

    @contextmanager
    def reading(self):
        """Turn database errors inside the block into a clear message (exit 1)."""
        from sqlalchemy.exc import DBAPIError

        try:
            yield
        except DBAPIError as e:
            hint = self._direct_hint() or "if the schema is older than this dl2ctl, start the daemon, which migrates it"
            raise click.ClickException(f"database error on {_shown(self.url)}: {e.orig} ({hint})") from e


def _shown(url: str) -> str:
    """The URL with its password hidden."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string()
    except Exception:
        return url


def open_db(url: str, hint: str | None = None):
    """An engine on ``url``, creating the schema in a database without one; a clear error (with ``hint``, when
    given) when it cannot be opened."""
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
                f"no directory {parent} for the database {u.database} ("
                + (hint or "is dl2d installed here? give --db URL or set DL2D_DB_URL") + ")")
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
        raise click.ClickException(f"cannot open the database {shown}: {e.orig}" + (f" ({hint})" if hint else "")) \
            from e
    return engine


def user_config() -> dict[str, Any]:
    """The daemon's config file as dl2ctl reads it: `$DL2D_CONFIG` or the default. The packaged config is
    readable by root and the daemon only (it may hold the database password): a user without read access goes
    on without it and reaches the daemon on its usual socket."""
    path = os.environ.get("DL2D_CONFIG") or DEFAULT_CONFIG
    if os.path.exists(path) and not os.access(path, os.R_OK):
        return {}
    return load_config(path)


def db_command(fn: Callable) -> Callable:
    """Add `--db URL` to a command and pass it a `Ctx` as first argument."""

    @click.option("--db", "db_url", metavar="URL",
                  help="Database URL, e.g. sqlite:////var/lib/dl2d/dl2d.sqlite or postgresql+psycopg://... "
                       "[default: $DL2D_DB_URL, else the db_url of $DL2D_CONFIG or /etc/dl2d/dl2d.toml, "
                       "else <$DL2D_STATE_DIR or /var/lib/dl2d>/dl2d.sqlite]")
    @functools.wraps(fn)
    def wrapper(db_url: str | None, **kwargs):
        config = user_config()
        ctx = Ctx(resolve_db_url(db_url, os.environ, config), config, resolve_socket(db_url, os.environ, config))
        return fn(ctx, **kwargs)

    return wrapper
