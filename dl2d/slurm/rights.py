"""May this process drain and resume Slurm nodes? (docs/slurm.md, "Rights".)

slurmctld accepts ``scontrol update NodeName=... State=DRAIN|RESUME`` only from a *super user*: root, the
cluster's ``SlurmUser``, or a user whose AdminLevel in Slurm's accounting database is ``Administrator``
(``validate_super_user`` in slurmctld; ``Operator`` is not enough for node updates). Anyone else gets
"Invalid user id". AdminLevels live in slurmdbd: without it (``AccountingStorageType`` other than
``accounting_storage/slurmdbd``) only root and SlurmUser can drain.

:func:`drain_rights_problem` decides from those facts (pure); :func:`check_drain_rights` gathers them
read-only (``scontrol show config``, ``sacctmgr show user``) through a driver that offers ``show_config``
and ``admin_level`` (the CLI driver) and returns one line naming what is missing, or None.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
from typing import Any, Mapping

#: AdminLevels (sacctmgr's words, lower case) that may update nodes.
DRAIN_LEVELS = frozenset({"administrator"})
SLURMDBD = "accounting_storage/slurmdbd"


def parse_show_config(text: str) -> dict[str, str]:
    """``scontrol show config`` (``Key = value`` lines) → ``{Key: value}``."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and re.fullmatch(r"[A-Za-z][\w]*", key.strip()):
            out.setdefault(key.strip(), value.strip())
    return out


def slurm_user(config: Mapping[str, str]) -> tuple[str, int | None]:
    """``SlurmUser = slurm(64030)`` → ("slurm", 64030); the uid is None when not shown."""
    value = config.get("SlurmUser", "")
    m = re.fullmatch(r"(.*?)\((\d+)\)", value)
    return (m[1], int(m[2])) if m else (value, None)


def drain_rights_problem(uid: int, user: str, config: Mapping[str, str], admin_level: str | None) -> str | None:
    """None when ``user`` (``uid``) may drain nodes; else one line naming what is missing and how to grant it.
    ``admin_level``: the user's AdminLevel from sacctmgr (None: not asked or not known to the database)."""
    su_name, su_uid = slurm_user(config)
    if uid == 0 or (su_uid is not None and uid == su_uid) or (su_uid is None and user == su_name):
        return None
    if (admin_level or "").strip().lower() in DRAIN_LEVELS:
        return None
    who = f"user {user} (uid {uid})"
    missing = f"{who} may not drain or resume Slurm nodes (scontrol update NodeName=... State=DRAIN): " \
              f"it is not root, not SlurmUser {su_name or '?'}"
    storage = config.get("AccountingStorageType", "")
    if storage != SLURMDBD:
        return (f"{missing}, and this Slurm has no accounting database (AccountingStorageType="
                f"{storage or '?'}) to grant it AdminLevel=Administrator: run dl2d as {su_name or 'SlurmUser'}, "
                f"or set up slurmdbd and run `sacctmgr modify user {user} set adminlevel=Administrator`")
    level = admin_level.strip() if admin_level and admin_level.strip() else None
    if level is None:
        return (f"{missing}, and it is not in Slurm's accounting database: run `sacctmgr add user {user} "
                f"account=<account> adminlevel=Administrator`")
    return (f"{missing}, and its AdminLevel is {level} (node updates need Administrator): run "
            f"`sacctmgr modify user {user} set adminlevel=Administrator`")


def current_user() -> tuple[int, str]:
    """(uid, name) of this process."""
    uid = os.geteuid()
    try:
        return uid, pwd.getpwuid(uid).pw_name
    except KeyError:
        return uid, str(uid)


def check_drain_rights(driver: Any, uid: int | None = None, user: str | None = None) -> str | None:
    """One line naming what this process lacks to drain nodes, or None when it may. Read-only: the
    driver's ``show_config()`` (``scontrol show config``) and, only where root/SlurmUser do not already
    decide it and slurmdbd keeps AdminLevels, ``admin_level(user)`` (``sacctmgr show user``).
    Raises the driver's SlurmError when Slurm cannot be asked; AttributeError when the driver cannot
    tell (it has no ``show_config``)."""
    if uid is None or user is None:
        uid, user = current_user()
    config = driver.show_config()
    problem = drain_rights_problem(uid, user, config, None)
    if problem is None or config.get("AccountingStorageType") != SLURMDBD:
        return problem
    return drain_rights_problem(uid, user, config, driver.admin_level(user))


def check_at_start(driver: Any, log: logging.Logger) -> str | None:
    """:func:`check_drain_rights`, logged as one line: an error naming what is missing, or a warning that it
    could not be checked (a driver that cannot read Slurm's configuration, or Slurm not answering: the
    daemon goes on either way). Returns what is missing, or None."""
    from dl2d.slurm.driver import SlurmError

    try:
        problem = check_drain_rights(driver)
    except AttributeError:
        log.warning("Slurm rights not checked: the %s driver cannot read Slurm's configuration; draining "
                    "nodes needs root, SlurmUser or AdminLevel=Administrator", type(driver).__name__)
        return None
    except SlurmError as e:
        log.warning("Slurm rights not checked (Slurm could not be asked: %s)", e)
        return None
    if problem:
        log.error("Slurm rights: %s", problem)
    return problem


def main() -> int:
    """``python -m dl2d.slurm.rights``: print whether this user may drain nodes (exit 0) or what it lacks
    (exit 1); exit 2 when Slurm cannot be asked. Uses the CLI driver (SLURM_CONF from the environment)."""
    import sys

    from dl2d.slurm.cli_driver import CliDriver
    from dl2d.slurm.driver import SlurmError

    try:
        problem = check_drain_rights(CliDriver())
    except SlurmError as e:
        print(f"cannot check the Slurm rights: {e}", file=sys.stderr)
        return 2
    uid, user = current_user()
    print(problem or f"user {user} (uid {uid}) may drain and resume Slurm nodes")
    return 1 if problem else 0


if __name__ == "__main__":
    raise SystemExit(main())
