"""Run `dl2ctl` as another, real unix user: ``python -m testkit.as_user USER -- ARGS...``.

The test Python may live where that user cannot read (root's home), so a plain ``setpriv ... python -m
dl2d.cli.main`` cannot even start. This loads, while still root, every module dl2ctl's job commands use, then
drops to the user for good (supplementary groups, gid, uid; the kernel then sees only that user) and runs
dl2ctl. Everything dl2ctl does after that (reading its config, connecting to the daemon's socket, opening the
database) happens with the user's rights only.
"""
from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path


def _preload() -> None:
    import grp  # noqa: F401
    import sqlite3  # noqa: F401
    import tomllib  # noqa: F401

    import rich.console  # noqa: F401
    import rich.table  # noqa: F401
    from sqlalchemy import inspect, text

    import dl2d.cli.dbconn  # noqa: F401
    import dl2d.cli.jobs  # noqa: F401
    import dl2d.cli.jobspec  # noqa: F401
    import dl2d.cli.nodes  # noqa: F401
    import dl2d.daemon.control  # noqa: F401
    import dl2d.db.engine
    import dl2d.db.jobs  # noqa: F401

    import dl2d.daemon.config
    from dl2d.policy import registry

    registry.entries()  # every policy module (the config's checks name them), and what they import
    dl2d.daemon.config.client_view({}, {})
    engine = dl2d.db.engine.make_engine("sqlite://")
    with engine.connect() as conn:  # loads the dialect and the inspector
        conn.execute(text("select 1"))
        inspect(conn).has_table("alembic_version")
    engine.dispose()


def main(argv: list[str]) -> int:
    user, sep, *args = argv
    assert sep == "--", "usage: python -m testkit.as_user USER -- DL2CTL-ARGS..."
    pw = pwd.getpwnam(user)
    from dl2d.cli.main import cli

    _preload()
    os.setgroups([])
    os.setgid(pw.pw_gid)
    os.setuid(pw.pw_uid)
    os.environ.update(HOME=pw.pw_dir, USER=user, LOGNAME=user)
    cli.main(args=args, prog_name="dl2ctl")  # exits, as dl2ctl does
    return 0


def dl2ctl(*args: str, user: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run dl2ctl as ``user`` (through this module) or as this process's user, with ``env`` on top of this
    process's environment less its DL2D_* variables, from ``/``."""
    repo = Path(__file__).resolve().parents[2]
    base = [sys.executable, "-m", "testkit.as_user", user, "--"] if user else [sys.executable, "-m", "dl2d.cli.main"]
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("DL2D_")}, **(env or {}),
            "PYTHONPATH": os.pathsep.join([str(repo / "tests"), str(repo)])}
    return subprocess.run([*base, *args], capture_output=True, text=True, env=full, cwd="/", timeout=120)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
