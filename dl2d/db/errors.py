"""The errors the repository functions of dl2d.db raise on purpose.

One module so that a caller (``dl2ctl cancel``) can catch them all with ``DBError`` whichever aggregate
module raised them.
"""
from __future__ import annotations

from collections.abc import Sequence


class DBError(Exception):
    """Base class of the errors dl2d.db raises on purpose."""


class SubmissionError(DBError, ValueError):
    """A malformed job submission; `errors` lists every problem found."""

    def __init__(self, errors: Sequence[str]):
        self.errors = list(errors)
        super().__init__("invalid job submission: " + "; ".join(self.errors))


class JobNotFound(DBError, LookupError):
    pass


class PermissionDenied(DBError, PermissionError):
    pass


class InvalidTransition(DBError):
    """A job or journal intent asked to move to a state it may not reach from its current one."""
