"""The daemon's control socket: where `dl2ctl submit` and `dl2ctl cancel` go, and where their rights are decided.

A local Unix stream socket (``[control] socket``, default ``<state_dir>/dl2d.sock``; the packaged unit uses
``/run/dl2d/dl2d.sock``), mode 0666: anyone on the host may connect, and the kernel tells the daemon who did
(``SO_PEERCRED``: the peer's uid at connect time, which no client can forge, as munge-less local services such
as D-Bus and systemd do). The daemon alone decides from that uid and its *own* config (``admin_group``) whether
the caller may cancel a job or submit for another user; what the client's config says does not matter.

Protocol: one JSON object per line each way, one request per connection.

* ``{"op": "whoami"}`` -> ``{"ok": true, "user", "uid", "admin"}``
* ``{"op": "status"}`` -> ``{"ok": true, "status": {...}}``: the daemon's state and its nodes (as the status
  file has them; what `dl2ctl nodes` lists)
* ``{"op": "submit", "submission": {...}}`` (the merged spec, as `dl2ctl submit` builds it) ->
  ``{"ok": true, "job": <job record>}`` or ``{"ok": false, "errors": [...]}`` (every problem; nothing written)
* ``{"op": "cancel", "job_ids": [..]}`` -> ``{"ok": true, "results": [{"id", "cancelled", "name"|"error"}]}``

Anything else (not JSON, not an object, an unknown op, a field of the wrong type, a request over
:data:`MAX_REQUEST_BYTES`, a request not complete within :data:`READ_TIMEOUT_S` of connecting) is answered
``{"ok": false, "error": ...}`` where the connection still allows it, logged in one line, and the server goes
on.

Anyone on the host may connect, so the socket is bounded as a server on the internet would be
(:mod:`dl2d.core.listener`): one deadline for the whole request, not one per read; at most
:data:`MAX_CONNECTIONS` connections at once and :data:`MAX_PER_UID` of them per uid, of which
:data:`RESERVED_SLOTS` only root and the daemon's own uid may take (:func:`privileged_uid`); a connection
beyond that is answered ``{"ok": false, "busy": true, ...}`` by the accepting thread, without a thread of
its own, and :func:`ask` tries again a little later. A connection that has not sent its request after a
second yields its place to a newer one of its own uid, or of a uid with a lighter share: slow clients
cannot lock out the others, nor strangers root.

:func:`handle` is the decision (request and caller in, reply out, writes through ``dl2d.db``);
:class:`ControlServer` is the socket shell around it, run in a thread beside the slot loop.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import socketserver
import stat
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from dl2d.core.listener import BoundedServerMixIn, DeadlineHandlerMixIn, Limits, Refused
from dl2d.core.users import is_admin, user_name
from dl2d.daemon import quota

log = logging.getLogger("dl2d")

#: A submission is a few hundred bytes; dl2ctl refuses spec files over 1 MB before sending them.
MAX_REQUEST_BYTES = 2 << 20
#: Seconds from connecting to the end of the request, all reads together (a client that stalls or trickles
#: its request must not hold a thread).
READ_TIMEOUT_S = 10.0
#: Connections served at once; beyond them a client is told "busy" by the accepting thread, not a thread each.
MAX_CONNECTIONS = 32
#: Connections of one uid at once (dl2ctl sends its request at once: a uid over this holds idle ones).
MAX_PER_UID = 8
#: Of MAX_CONNECTIONS, slots only root and the daemon's own uid may take: other uids together cannot fill them.
RESERVED_SLOTS = 4
#: Job ids in one cancel request (dl2ctl cancel takes them on its command line).
MAX_CANCEL_IDS = 10_000
#: AF_UNIX socket paths are at most this many bytes (sun_path is 108 bytes with its terminating NUL).
MAX_SOCKET_PATH_BYTES = 107
#: Tries of a client whose connection finds the daemon's backlog full (about 10 s in all).
CONNECT_ATTEMPTS = 15
OPS = ("whoami", "status", "submit", "cancel")


@dataclass(frozen=True)
class Caller:
    """Who is on the other end of a connection, as the kernel reports it, and what dl2d makes of it."""

    uid: int
    gid: int
    pid: int
    user: str
    admin: bool


def caller_of(uid: int, gid: int, pid: int, admin_group: str) -> Caller:
    user = user_name(uid)
    return Caller(uid=uid, gid=gid, pid=pid, user=user, admin=uid == 0 or is_admin(user, admin_group))


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process that connected (Linux ``SO_PEERCRED``)."""
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", raw)


# ---------------------------------------------------------------------------------------------- decision

def _error(message: str) -> dict[str, Any]:
    return {"ok": False, "error": message}


def _job_ids(value: Any) -> list[int] | str:
    """The request's job ids, or what is wrong with them."""
    if not isinstance(value, list) or not value:
        return "job_ids must be a non-empty list of job ids"
    if len(value) > MAX_CANCEL_IDS:
        return f"job_ids: at most {MAX_CANCEL_IDS} ids in one request, got {len(value)}"
    bad = [v for v in value if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v < 2 ** 63]
    if bad:
        return f"job_ids: not a job id: {bad[0]!r} (ids are integers from 1 to 2^63-1)"
    return list(value)


def handle(request: Any, caller: Caller, engine: Any, status: Callable[[], dict[str, Any]] | None = None,
           gate: quota.SubmitGate | None = None) -> dict[str, Any]:
    """The reply to one request from ``caller`` (see the module doc); writes go through ``dl2d.db``;
    ``status()``: the daemon's status document; ``gate``: the per-user submission limits (None: none)."""
    if not isinstance(request, dict):
        return _error(f"a request is a JSON object, got {type(request).__name__}")
    op = request.get("op")
    if op not in OPS:
        return _error(f"unknown op {op!r}: one of {', '.join(OPS)}")
    if op == "whoami":
        return {"ok": True, "user": caller.user, "uid": caller.uid, "admin": caller.admin}
    if op == "status":
        return {"ok": True, "status": status() if status is not None else {}}
    if op == "cancel":
        from dl2d.db.jobs import cancel_jobs

        ids = _job_ids(request.get("job_ids"))
        if isinstance(ids, str):
            return _error(ids)
        results = cancel_jobs(engine, ids, caller.user, admin=caller.admin)
        for r in results:
            log.info("control: %s (uid %d) %s job %s%s", caller.user, caller.uid,
                     "cancelled" if r["cancelled"] else "was refused cancelling", r["id"],
                     "" if r["cancelled"] else f": {r['error']}")
        return {"ok": True, "results": results}
    return _submit(request.get("submission"), caller, engine, gate)


def _submit(data: Any, caller: Caller, engine: Any, gate: quota.SubmitGate | None = None) -> dict[str, Any]:
    from dl2d.db.engine import session_scope
    from dl2d.db.errors import SubmissionError
    from dl2d.db.jobs import job_record, submission_owner_problem, submit_job, user_job_counts, validate_submission
    from dl2d.db.models import utcnow

    if not isinstance(data, dict):
        return _error(f"submission must be a JSON object, got {type(data).__name__}")
    data = {**data}
    data.setdefault("owner", caller.user)
    errors: list[str] = []
    problem = submission_owner_problem(data.get("owner"), caller.user, caller.admin)
    if problem:
        errors.append(problem)
    try:
        sub = validate_submission(data)
    except SubmissionError as e:
        errors.extend(e.errors)
    if errors:
        log.info("control: submission by %s (uid %d) refused: %s", caller.user, caller.uid, "; ".join(errors))
        return {"ok": False, "errors": errors}
    with gate.held() if gate is not None else contextlib.nullcontext(), session_scope(engine) as s:
        refusal = gate.check(caller.uid, sub.owner, lambda: user_job_counts(s, sub.owner)) if gate else None
        if refusal is None:
            job = submit_job(s, sub)
            rec = job_record(job, utcnow())
    if refusal is not None:
        log.info("control: submission by %s (uid %d) refused: %s", caller.user, caller.uid, refusal)
        return {"ok": False, "errors": [refusal]}
    log.info("control: %s (uid %d) submitted job %s (%s) for %s", caller.user, caller.uid, rec["id"],
             rec["name"], rec["owner"])
    return {"ok": True, "job": rec}


# ---------------------------------------------------------------------------------------------- the shell

def read_request(rfile: Any, limit: int = MAX_REQUEST_BYTES) -> Any:
    """One JSON line from ``rfile``; ValueError naming what is wrong (too long, no line, not JSON)."""
    line = rfile.readline(limit + 1)
    if len(line) > limit:
        raise ValueError(f"request larger than {limit} bytes")
    if not line.endswith(b"\n"):
        raise ValueError("request not ended by a newline (connection closed early)")
    try:
        return json.loads(line)
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"request is not JSON: {e}") from None


def privileged_uid(uid: int, daemon_uid: int) -> bool:
    """Whether a caller may take the control socket's reserved slots: root and the daemon's own account,
    whom no other user's connections may lock out."""
    return uid == 0 or uid == daemon_uid


def control_limits() -> Limits:
    """The socket's admission rules (dl2d.core.listener.decide), from this module's bounds."""
    return Limits(total=MAX_CONNECTIONS, per_peer=MAX_PER_UID, reserved=RESERVED_SLOTS)


BUSY = "dl2d is busy: too many control connections at once; try again"


class _Handler(DeadlineHandlerMixIn, socketserver.StreamRequestHandler):
    server: "_Server"

    def handle(self) -> None:
        srv = self.server
        pid, uid, gid = peer_credentials(self.connection)
        caller = caller_of(uid, gid, pid, srv.admin_group)
        try:
            request = read_request(self.rfile)
        except (ValueError, OSError) as e:
            reason = "no request within the read timeout" if isinstance(e, TimeoutError) else str(e)
            log.warning("control: bad request from %s (uid %d, pid %d): %s", caller.user, uid, pid, reason)
            self._reply(_error(reason))
            return
        self.ticket.answering()
        try:
            reply = handle(request, caller, srv.engine, srv.status, srv.gate)
        except Exception as e:  # a database error must not end the server: the caller hears it
            log.exception("control: request %r from %s failed", request.get("op") if isinstance(request, dict)
                          else None, caller.user)
            reply = _error(f"dl2d could not carry out the request: {type(e).__name__}: {e}")
        self._reply(reply)

    def _reply(self, reply: dict[str, Any]) -> None:
        try:
            self.wfile.write(json.dumps(reply).encode() + b"\n")
        except OSError:
            pass  # the client went away


class _Server(BoundedServerMixIn, socketserver.UnixStreamServer):
    allow_reuse_address = False

    def __init__(self, path: str, engine: Any, admin_group: str, status: Callable[[], dict[str, Any]] | None,
                 gate: quota.SubmitGate | None = None) -> None:
        self.engine = engine
        self.admin_group = admin_group
        self.status = status
        self.gate = gate
        self.daemon_uid = os.geteuid()
        super().__init__(path, _Handler, limits=control_limits(), deadline_s=READ_TIMEOUT_S)

    def peer_of(self, request: socket.socket, client_address: Any) -> tuple[int, bool]:
        _pid, uid, _gid = peer_credentials(request)
        return uid, privileged_uid(uid, self.daemon_uid)

    def refuse_request(self, request: socket.socket, refused: Refused) -> None:
        request.send(json.dumps({"ok": False, "busy": True, "error": BUSY}).encode() + b"\n")


class ControlError(RuntimeError):
    """The control socket cannot be set up; the message says why and what to change."""


def socket_path_problem(path: str) -> str | None:
    """Why ``path`` cannot be a Unix socket's path (None: it can)."""
    if not path:
        return "is empty"
    n = len(os.fsencode(path))
    if n > MAX_SOCKET_PATH_BYTES:
        return f"is {n} bytes long; a Unix socket's path may have at most {MAX_SOCKET_PATH_BYTES}"
    return None


def _clear_stale(path: Path) -> None:
    """Remove a socket file left by a daemon that died; refuse anything that is not a socket, and a socket
    someone still answers on."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ControlError(f"control socket {path}: a file that is not a socket is in the way; remove it or set "
                           "[control] socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink()  # nobody listens: stale
        return
    finally:
        probe.close()
    raise ControlError(f"control socket {path}: another process answers on it (a second dl2d?); stop it or set "
                       "[control] socket")


class ControlServer:
    """The control socket, served by a thread: ``start()``, then ``close()`` when the daemon stops."""

    def __init__(self, path: str, engine: Any, admin_group: str,
                 status: Callable[[], dict[str, Any]] | None = None, limits: quota.Limits | None = None) -> None:
        self.path = path
        self.engine = engine
        self.admin_group = admin_group
        self.status = status
        self.gate = quota.SubmitGate(limits) if limits is not None else None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        problem = socket_path_problem(self.path)
        if problem:
            raise ControlError(f"control socket path {self.path!r} {problem}: set [control] socket")
        path = Path(self.path)
        if not path.parent.is_dir():
            raise ControlError(f"control socket {path}: no directory {path.parent}")
        _clear_stale(path)
        try:
            self._server = _Server(str(path), self.engine, self.admin_group, self.status, self.gate)
            os.chmod(path, 0o666)  # anyone may ask; SO_PEERCRED says who asked
        except OSError as e:
            raise ControlError(f"control socket {path}: {e.strerror or e}") from None
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="dl2d-control", daemon=True)
        self._thread.start()
        log.info("control socket %s (admins: root and group %s)", path, self.admin_group)

    def close(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        try:
            Path(self.path).unlink()
        except FileNotFoundError:
            pass
        self._server = None


# ---------------------------------------------------------------------------------------------- the client

class NoDaemon(ConnectionError):
    """Nobody answers on the control socket (no such file, or a stale one): the daemon is not running."""


def _ask_once(path: str, request: dict[str, Any], timeout: float) -> dict[str, Any]:
    """One connection, one request, its reply (see :func:`ask`)."""
    problem = socket_path_problem(path)
    if problem:
        raise ConnectionError(f"control socket path {path!r} {problem}")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        for attempt in range(CONNECT_ATTEMPTS):
            try:
                sock.connect(path)
                break
            except (FileNotFoundError, ConnectionRefusedError) as e:
                raise NoDaemon(f"no dl2d answers on {path} ({e.strerror})") from None
            except BlockingIOError:  # the daemon's backlog is full: a burst of clients; wait a little
                if attempt == CONNECT_ATTEMPTS - 1:
                    raise ConnectionError(f"dl2d on {path} is too busy to accept a connection; try again") \
                        from None
                time.sleep(min(0.05 * 2 ** attempt, 1.0))
            except OSError as e:
                raise ConnectionError(f"cannot connect to dl2d on {path}: {e.strerror or e}") from None
        try:
            try:
                sock.sendall(json.dumps(request).encode() + b"\n")
            except (BrokenPipeError, ConnectionResetError):
                pass  # the daemon answered before reading (busy) and closed: its line is still to be read
            with sock.makefile("rb") as f:
                line = f.readline(MAX_REQUEST_BYTES + 1)
        except OSError as e:
            raise ConnectionError(f"dl2d on {path} did not answer: {e.strerror or e}") from None
    finally:
        sock.close()
    try:
        reply = json.loads(line)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise ConnectionError(f"dl2d on {path} sent no valid reply ({line[:80]!r})")
    return reply


def ask(path: str, request: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
    """Send one request to the daemon at ``path`` and return its reply (what `dl2ctl` does). NoDaemon when no
    daemon listens there; ConnectionError naming what went wrong for anything else. A "busy" answer (the
    daemon's share for this user is taken, by a burst of this user's own calls or by idle connections) is
    tried again for about 10 s before it is returned."""
    for attempt in range(CONNECT_ATTEMPTS):
        reply = _ask_once(path, request, timeout)
        if not reply.get("busy") or attempt == CONNECT_ATTEMPTS - 1:
            return reply
        time.sleep(min(0.05 * 2 ** attempt, 1.0))
    return reply
