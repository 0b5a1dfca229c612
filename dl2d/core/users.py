"""Who a unix user is, and whether they are a dl2d admin: the one rule the daemon's control socket decides
rights by (and `dl2ctl`'s direct database mode repeats as a courtesy).

Admins are root and the members (primary or supplementary) of the admin group, ``dl2d-admin`` unless the
daemon's config names another (``admin_group``). A uid is turned into a name by the password database; a uid
without an entry (containers) is its number written out, as ``id -un`` would fail to do.
"""
from __future__ import annotations

import os
import pwd

DEFAULT_ADMIN_GROUP = "dl2d-admin"


def user_name(uid: int) -> str:
    """The login name of ``uid``; ``root`` for 0 and the number itself for a uid without a passwd entry."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "root" if uid == 0 else str(uid)


def current_user() -> str:
    """The user running this process, from its effective uid (not $USER, which anyone can set)."""
    return user_name(os.geteuid())


def is_admin(user: str, group: str = DEFAULT_ADMIN_GROUP) -> bool:
    """root, or a member (primary or supplementary) of ``group``."""
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
