"""Shared test data of the database and CLI tests: a valid submission, row counts."""
from __future__ import annotations

import copy
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

VALID: dict[str, Any] = {
    "name": "resnet-a",
    "owner": "alice",
    "job_type": "resnet-50",
    "total_epochs": 30,
    "command": "python train.py --model resnet50",
    "worker": {"gpus": 1, "cpus": 2, "mem_gb": 8},
    "ps": {"cpus": 2, "mem_gb": 4},
    "max_workers": 8,
    "max_ps": 4,
}


def submission(**changes: Any) -> dict[str, Any]:
    """VALID with changes; a value of `...` removes the key."""
    d = copy.deepcopy(VALID)
    for k, v in changes.items():
        if v is ...:
            d.pop(k, None)
        else:
            d[k] = v
    return d


def count(session: Session, model) -> int:
    return session.scalar(select(func.count()).select_from(model))
