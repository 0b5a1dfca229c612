"""Canonical JSON and its sha256: one definition for the two digests the database stores.

A decision's `state_digest` (the policy input) and an intent's `idempotency_key` must hash the same
value to the same hex on every run and backend, so both go through :func:`canonical_json`.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no spaces (anything not JSON-native as ``str``)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def state_digest(state: Any) -> str:
    """sha256 hex of the policy input (bytes as is, anything else as canonical JSON)."""
    data = state if isinstance(state, bytes) else canonical_json(state).encode()
    return hashlib.sha256(data).hexdigest()
