"""Authentication of the elastic runtime's connections (docs/elastic.md, "Authentication").

Every job has one secret (``DL2D_JOB_SECRET_FILE``, written by the daemon; or made by a standalone
``dl2-run``). Two keys are derived from it:

* the **control** key: held by whoever has the secret, the daemon and ``dl2-run`` (its coordinator);
  it may ``SCALE``, ``CHECKPOINT``, ``SHUTDOWN`` and ``DEC_*`` a job;
* the **member** key: handed to the PS and worker processes (in their environment, never on a command
  line); it may register, report and move parameters, not resize or stop the job.

Every connection starts with a challenge-response handshake, before any other frame is read::

    server -> client  {"op": "AUTH_CHALLENGE", "nonce": <32 random bytes, hex>}
    client -> server  {"op": "AUTH", "role": "member"|"control", "nonce": <32 random bytes, hex>,
                       "proof": HMAC-SHA256(key[role], "dl2d-elastic/v1 client <role>" | server nonce | client nonce)}
    server -> client  {"ok": true, "proof": HMAC-SHA256(key[role], "dl2d-elastic/v1 server <role>" | ...)}
                      or {"ok": false, "error": ...} and the connection is closed

The server checks the client's proof in constant time (``hmac.compare_digest``); the client checks the
server's (mutual: a fake coordinator or PS that lacks the key is found out before it is sent anything).
Fresh nonces on both sides make a recorded handshake useless on another connection, and the side and role
in the MAC make one side's proof useless as the other's. This module is the pure part (keys, proofs,
checks of handshake frames); :mod:`.protocol` does the I/O.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
from dataclasses import dataclass
from typing import Mapping

#: Names a file holding the job's secret (the daemon's batch script exports it).
SECRET_FILE_ENV = "DL2D_JOB_SECRET_FILE"
#: A role process's member key (hex), set by the spawner in the role's environment.
MEMBER_KEY_ENV = "DL2D_ELASTIC_MEMBER_KEY"
CONTROL, MEMBER = "control", "member"
ROLES = (CONTROL, MEMBER)
NONCE_BYTES = 32
_VERSION = b"dl2d-elastic/v1"
_HEX64 = re.compile(r"[0-9a-f]{64}")


class AuthError(ConnectionError):
    """A handshake that failed: the peer lacks the job's secret, answered wrongly or not at all."""


def derive_keys(secret: str | bytes) -> dict[str, bytes]:
    """The control and member keys of a job's secret (HMAC-SHA256 of the secret over a fixed label)."""
    s = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    if not s:
        raise ValueError("empty job secret")
    return {role: hmac.new(s, _VERSION + b" key " + role.encode(), hashlib.sha256).digest() for role in ROLES}


def proof(key: bytes, side: str, role: str, server_nonce: bytes, client_nonce: bytes) -> str:
    """HMAC-SHA256(key, "dl2d-elastic/v1 <side> <role>" | server nonce | client nonce), hex. ``side`` is
    ``client`` or ``server``: one side's proof is never the other's."""
    msg = b"%s %s %s|" % (_VERSION, side.encode(), role.encode()) + server_nonce + client_nonce
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Credentials:
    """What one process holds: ``keys`` (role -> key), the roles its server accepts; ``role``, the one it
    proves as a client."""
    keys: Mapping[str, bytes]
    role: str

    def __post_init__(self) -> None:
        if self.role not in self.keys:
            raise ValueError(f"no key for role {self.role!r}")

    @classmethod
    def from_secret(cls, secret: str | bytes, role: str = CONTROL) -> "Credentials":
        """The job's secret: both keys (the coordinator's server, the daemon's client)."""
        return cls(derive_keys(secret), role)

    @classmethod
    def member(cls, key: bytes) -> "Credentials":
        """A PS or worker: the member key only."""
        if len(key) != 32:
            raise ValueError("a member key is 32 bytes")
        return cls({MEMBER: bytes(key)}, MEMBER)

    def as_role(self, role: str) -> "Credentials":
        return Credentials(self.keys, role)

    def __repr__(self) -> str:  # never print a key
        return f"Credentials(roles={sorted(self.keys)}, role={self.role!r})"


def member_key_from_env(environ: dict | None = None) -> bytes:
    """The member key a spawner put in ``$DL2D_ELASTIC_MEMBER_KEY`` (removed from ``environ``); ValueError
    when it is missing or malformed."""
    env = os.environ if environ is None else environ
    raw = env.pop(MEMBER_KEY_ENV, None)
    if not raw or not _HEX64.fullmatch(raw):
        raise ValueError(f"no member key in ${MEMBER_KEY_ENV} (64 hex digits): roles are started by dl2-run")
    return bytes.fromhex(raw)


# -- the handshake's frames, built and checked (pure) ------------------------------------------------------
def challenge(server_nonce: bytes) -> dict:
    return {"op": "AUTH_CHALLENGE", "nonce": server_nonce.hex()}


def _nonce(header: Mapping, what: str) -> bytes:
    n = header.get("nonce")
    if not isinstance(n, str) or not _HEX64.fullmatch(n):
        raise AuthError(f"{what} has no nonce of {NONCE_BYTES} bytes in hex")
    return bytes.fromhex(n)


def read_challenge(header: Mapping) -> bytes:
    """The server nonce of a challenge; AuthError when the peer sent something else (it does not authenticate,
    or it is not a dl2d elastic server)."""
    if header.get("op") != "AUTH_CHALLENGE":
        raise AuthError("the peer sent no authentication challenge (not an authenticating dl2d elastic peer)")
    return _nonce(header, "the challenge")


def answer(creds: Credentials, server_nonce: bytes, client_nonce: bytes) -> dict:
    return {"op": "AUTH", "role": creds.role, "nonce": client_nonce.hex(),
            "proof": proof(creds.keys[creds.role], "client", creds.role, server_nonce, client_nonce)}


def check_answer(header: Mapping, keys: Mapping[str, bytes], server_nonce: bytes) -> tuple[str, bytes]:
    """A client's answer to ``server_nonce`` checked against ``keys``: ``(role, client nonce)``, or AuthError
    with a one-line reason. The proof is compared in constant time."""
    op = header.get("op")
    if op != "AUTH":
        shown = repr(op)[:40] if op is not None else "a reply"
        raise AuthError(f"no authentication: the first frame is {shown}, not AUTH (the job's secret is needed)")
    role = header.get("role")
    if not isinstance(role, str) or role not in keys:
        raise AuthError(f"AUTH for a role this server does not accept: {repr(role)[:40]}")
    client_nonce = _nonce(header, "AUTH")
    if client_nonce == server_nonce:
        raise AuthError("AUTH echoes the server's nonce")
    got = header.get("proof")
    want = proof(keys[role], "client", role, server_nonce, client_nonce)
    if not isinstance(got, str) or not hmac.compare_digest(got.encode("ascii", "replace"), want.encode()):
        raise AuthError(f"wrong proof for role {role} (not the job's secret, or a replayed handshake)")
    return role, client_nonce


def verdict(keys: Mapping[str, bytes], role: str, server_nonce: bytes, client_nonce: bytes) -> dict:
    return {"ok": True, "proof": proof(keys[role], "server", role, server_nonce, client_nonce)}


def check_verdict(header: Mapping, creds: Credentials, server_nonce: bytes, client_nonce: bytes) -> None:
    """The server's reply to our answer: it accepted us and proved it holds our key; else AuthError."""
    if header.get("ok") is not True:
        raise AuthError(f"refused by the peer: {str(header.get('error', 'no reason given'))[:200]}")
    want = proof(creds.keys[creds.role], "server", creds.role, server_nonce, client_nonce)
    got = header.get("proof")
    if not isinstance(got, str) or not hmac.compare_digest(got.encode("ascii", "replace"), want.encode()):
        raise AuthError("the peer failed to prove that it holds the job's secret (a fake coordinator or PS?)")
