"""Wire protocol of the elastic job runtime.

Every message between the coordinator, the parameter servers (PS) and the
workers is one *frame* on a TCP stream::

    +--------+-------------+--------------+-------------------+-----------------+
    | "DL2E" | header_len  | payload_len  | header (JSON)     | payload (bytes) |
    | 4 B    | u32 big-end | u64 big-end  | header_len bytes  | payload_len B   |
    +--------+-------------+--------------+-------------------+-----------------+

* ``header`` is a UTF-8 JSON object.  It always has an ``"op"`` string
  (requests) or an ``"ok"`` boolean (replies); replies with ``"ok": false``
  carry an ``"error"`` string.  All other keys are op-specific scalars, lists
  and dicts of JSON types.
* If the message carries arrays, ``header["arrays"]`` lists them in order as
  ``{"name": str, "dtype": "float32", "shape": [int, ...]}``.  The payload is
  the concatenation of their raw little-endian C-order buffers, in that order.
  Only ``float32`` is accepted; nothing is ever pickled.

A received frame is bounded and checked before anything is built from it
(:func:`parse_header`): the header at most ``MAX_HEADER`` bytes, the payload at
most ``MAX_PAYLOAD`` and exactly the size its arrays declare (checked before a
byte of it is read), every header field of the right type; once a frame has
begun, each read must bring bytes within ``FRAME_STALL_S``. A frame that breaks
any of this raises :class:`FrameError` (a :class:`ProtocolError`); a server logs
it in one line and closes that connection.

The transport is request/response: a client sends one request frame on a
connection and reads exactly one reply frame.  A server serves each accepted
connection in its own thread, so a handler may block (for instance a
synchronous-mode ``PULL`` waiting for the next model version) without holding
up other peers.

A server given credentials (every server of the runtime) authenticates each
connection before it reads any other frame: the challenge-response of
:mod:`.auth`, all of it within ``HANDSHAKE_TIMEOUT_S``; a client given
credentials answers it and checks the server's proof in turn. A connection idle
for ``IDLE_TIMEOUT_S`` between frames is closed (a client reconnects before that).

Until its handshake is done a connection is a stranger's, and the server bounds
strangers as a server on the internet would (:mod:`dl2d.core.listener`): at most
``MAX_HANDSHAKES`` connections in the handshake at once and
``MAX_HANDSHAKES_PER_PEER`` of them from one address; one beyond that is closed
by the accepting thread at once (no thread, no challenge), and a client given
credentials tries again for a while. A connection that has not answered the
challenge after a second yields its place to a newer one from its address (or
from an address with a lighter share), so idle strangers cannot keep the job's
own roles, the daemon or ``dl2-run`` out. An authenticated connection no longer
counts against the strangers' pool at all.
"""

from __future__ import annotations

import json
import logging
import secrets
import socket
import struct
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, NamedTuple

import numpy as np

from dl2d.core.listener import Limits, PeerLimiter, Refused, Ticket, shut_reads

from . import auth as A
from .auth import AuthError, Credentials

log = logging.getLogger(__name__)

MAGIC = b"DL2E"
_PREFIX = struct.Struct("!4sIQ")
#: Largest header. Real ones are at most tens of KB: the largest lists a GET_BLOCKS reply's arrays (two per
#: block; a 25M-parameter model has ~260 blocks: ~25 KB), or the 1 544 arrays of the gathered-write test (~70 KB).
MAX_HEADER = 1024 * 1024
#: Largest payload. The largest frames are a PS's GET_BLOCKS reply and the PUT_BLOCKS that places or restores
#: its blocks: parameters and momentum of every block it holds, 8 bytes a parameter. 1 GiB carries a
#: 134M-parameter model on a single PS (docs/elastic.md's example is 25M, the benchmark's 2.5M).
MAX_PAYLOAD = 1024 ** 3
#: Most dimensions of an array (the runtime sends 1-D blocks; numpy itself allows 64).
MAX_NDIM = 32
#: Longest ``op`` (the runtime's are at most 12 characters) and array name ("p<block>", "m<block>").
MAX_OP_CHARS = 64
MAX_NAME_CHARS = 256
#: Once a frame's prefix has arrived, every further read must bring bytes within this many seconds: a sender
#: writes a frame in one go, so a longer silence is a dead or hostile peer holding the frame's buffer.
FRAME_STALL_S = 60.0
#: A new connection must complete the authentication handshake within this many seconds (all of it).
HANDSHAKE_TIMEOUT_S = 10.0
#: Largest handshake frame header (they are about 250 bytes; no payload).
MAX_AUTH_HEADER = 1024
#: Connections in the handshake at once; more are closed at once (a flood of strangers holds no threads).
MAX_HANDSHAKES = 64
#: Connections in the handshake at once from one address (the roles of one node connect in bursts: a burst
#: beyond this is turned away and tried again by its clients).
MAX_HANDSHAKES_PER_PEER = 16
#: A connection with no frame for this long is closed by the server; a client reconnects after half of it.
IDLE_TIMEOUT_S = 900.0
#: Refused connections logged per server and per 10 s (the rest are counted in the next line).
MAX_REFUSAL_LINES = 20
_DTYPE = np.dtype("<f4")
_SPEC_KEYS = {"name", "dtype", "shape"}

Arrays = dict[str, np.ndarray]
Handler = Callable[[dict, Arrays], "tuple[dict, Arrays | None] | dict"]


class ProtocolError(Exception):
    """Malformed frame on the wire."""


class FrameError(ProtocolError):
    """A received frame that breaks the wire format or its bounds; the message says which field and why."""


class RemoteError(Exception):
    """The peer answered with ``ok: false``."""


class Peer(NamedTuple):
    """Who sent a request: its address and the role it authenticated as (None on an unauthenticated server)."""
    address: str
    role: str | None


def encode(header: dict, arrays: Arrays | None = None) -> list[bytes | memoryview]:
    """Encode a frame as a list of buffers (header prefix + array buffers)."""
    header = dict(header)
    bufs: list[memoryview] = []
    specs = []
    total = 0
    for name, arr in (arrays or {}).items():
        a = np.ascontiguousarray(arr, dtype=_DTYPE)
        specs.append({"name": name, "dtype": "float32", "shape": list(a.shape)})
        mv = memoryview(a.reshape(-1)).cast("B")  # (flat: memoryview cannot cast a (0, n) shape)
        bufs.append(mv)
        total += mv.nbytes
    if specs:
        header["arrays"] = specs
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    if len(hb) > MAX_HEADER:
        raise ProtocolError(f"header too large ({len(hb)} bytes, at most {MAX_HEADER})")
    if total > MAX_PAYLOAD:
        raise ProtocolError(f"payload too large ({total} bytes, at most {MAX_PAYLOAD}): a model this size needs "
                            "more parameter servers")
    return [_PREFIX.pack(MAGIC, len(hb), total) + hb, *bufs]


def _show(v: Any) -> str:
    """A header value for an error message, cut short (a field may hold a megabyte or a nested list)."""
    if isinstance(v, (list, dict)):
        return f"a JSON {'list' if isinstance(v, list) else 'object'} of {len(v)} items"
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 64:
        return f"an integer of {v.bit_length()} bits"
    r = repr(v[:40] if isinstance(v, str) else v)
    return r if len(r) <= 60 else r[:57] + "..."


Spec = tuple[str, tuple[int, ...], int]  # name, shape, element count


def _array_spec(spec: Any, i: int, names: set[str]) -> Spec:
    """``header["arrays"][i]`` checked: exactly name (a new string), dtype float32 and a shape of at most
    MAX_NDIM non-negative integers."""
    where = f"arrays[{i}]"
    if not isinstance(spec, dict):
        raise FrameError(f"{where} is not an object: {_show(spec)}")
    if spec.keys() != _SPEC_KEYS:
        raise FrameError(f"{where} must have exactly the keys dtype, name, shape, got {_show(', '.join(sorted(spec)))}")
    name, dtype, shape = spec["name"], spec["dtype"], spec["shape"]
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_CHARS:
        raise FrameError(f"{where}.name must be a string of 1 to {MAX_NAME_CHARS} characters, got {_show(name)}")
    if name in names:
        raise FrameError(f"{where}.name {_show(name)} is given twice")
    if dtype != "float32":
        raise FrameError(f"{where}: unsupported dtype {_show(dtype)} (only float32)")
    if not isinstance(shape, list) or len(shape) > MAX_NDIM:
        raise FrameError(f"{where}.shape must be a list of at most {MAX_NDIM} dimensions, got {_show(shape)}")
    n = 1
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d <= MAX_PAYLOAD:
            raise FrameError(f"{where}.shape has a dimension that is not an integer in 0..{MAX_PAYLOAD}: "
                             f"{_show(d)}" + (" (negative dimension)" if isinstance(d, int) and d < 0 else ""))
        n = min(n * d, MAX_PAYLOAD + 1)  # capped: the product of 32 dimensions stays a small integer
    names.add(name)
    return name, tuple(shape), n


def parse_header(header_bytes: bytes, payload_len: int) -> tuple[dict, list[Spec]]:
    """A frame's header checked against the payload length its prefix declared, before the payload is read:
    ``(header without "arrays", [(name, shape, count)])``. Pure; FrameError says what is wrong."""
    if len(header_bytes) > MAX_HEADER:
        raise FrameError(f"header of {len(header_bytes)} bytes, at most {MAX_HEADER}")
    if not 0 <= payload_len <= MAX_PAYLOAD:
        raise FrameError(f"payload of {payload_len} bytes, at most {MAX_PAYLOAD}")
    try:
        header = json.loads(header_bytes.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise FrameError(f"bad header: byte {e.start} is not UTF-8") from None
    except json.JSONDecodeError as e:
        raise FrameError(f"bad header: not JSON ({e.msg} at byte {e.pos})") from None
    except RecursionError:
        raise FrameError("bad header: JSON nested too deeply") from None
    except ValueError as e:  # an integer of thousands of digits (Python's int conversion limit)
        raise FrameError(f"bad header: {str(e).split(':')[0]}") from None
    if not isinstance(header, dict):
        raise FrameError(f"header is not a JSON object: {_show(header)}")
    if "op" in header and not (isinstance(header["op"], str) and 0 < len(header["op"]) <= MAX_OP_CHARS):
        raise FrameError(f"header 'op' must be a string of 1 to {MAX_OP_CHARS} characters, got {_show(header['op'])}")
    if "ok" in header and not isinstance(header["ok"], bool):
        raise FrameError(f"header 'ok' must be true or false, got {_show(header['ok'])}")
    if "op" not in header and "ok" not in header:
        raise FrameError("header has neither 'op' (a request) nor 'ok' (a reply)")
    if "error" in header and not isinstance(header["error"], str):
        raise FrameError(f"header 'error' must be a string, got {_show(header['error'])}")
    raw = header.pop("arrays", [])
    if not isinstance(raw, list):
        raise FrameError(f"header 'arrays' must be a list, got {_show(raw)}")
    specs: list[Spec] = []
    names: set[str] = set()
    total = 0
    for i, spec in enumerate(raw):
        specs.append(_array_spec(spec, i, names))
        total += specs[-1][2] * _DTYPE.itemsize
        if total > payload_len:  # (each count is capped, so the sum stays small however large the shapes)
            raise FrameError(f"payload shorter than declared arrays ({payload_len} bytes; arrays[0..{i}] need more)")
    if total != payload_len:
        raise FrameError(f"payload longer than declared arrays ({payload_len} bytes, the arrays take {total})")
    return header, specs


def _arrays(specs: list[Spec], payload) -> Arrays:
    """Views of the payload (any buffer of exactly the specs' size) as the declared arrays."""
    arrays: Arrays = {}
    off = 0
    for name, shape, n in specs:
        a = np.frombuffer(payload, dtype=_DTYPE, count=n, offset=off)
        arrays[name] = a if len(shape) == 1 else a.reshape(shape)
        off += n * _DTYPE.itemsize
    return arrays


def decode(header_bytes: bytes, payload: bytearray | bytes) -> tuple[dict, Arrays]:
    """A whole received frame (header bytes and payload) as ``(header, arrays)``; FrameError if malformed."""
    header, specs = parse_header(header_bytes, len(payload))
    return header, _arrays(specs, payload)


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    _recv_into(sock, memoryview(buf))
    return buf


def _recv_into(sock: socket.socket, mv: memoryview) -> None:
    n, got = mv.nbytes, 0
    while got < n:
        k = sock.recv_into(mv[got:], min(n - got, 1 << 22))
        if k == 0:
            raise ConnectionError("connection closed")
        got += k


def _recv_by(sock: socket.socket, n: int, deadline: float) -> bytes:
    """``n`` bytes, all of them before ``deadline`` (time.monotonic); TimeoutError after it."""
    buf = bytearray(n)
    mv, got = memoryview(buf), 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed")
        sock.settimeout(left)
        k = sock.recv_into(mv[got:], n - got)
        if k == 0:
            raise ConnectionError("connection closed")
        got += k
    return bytes(buf)


def recv_handshake(sock: socket.socket, deadline: float) -> dict:
    """One handshake frame (a header of at most MAX_AUTH_HEADER bytes, no payload), whole before ``deadline``.
    FrameError for a frame that breaks that, TimeoutError after the deadline, ConnectionError at EOF."""
    magic, hlen, plen = _PREFIX.unpack(_recv_by(sock, _PREFIX.size, deadline))
    if magic != MAGIC:
        raise FrameError(f"bad magic {magic!r}")
    if hlen > MAX_AUTH_HEADER or plen:
        raise FrameError(f"not an authentication frame (header of {hlen} bytes, payload of {plen}; at most "
                         f"{MAX_AUTH_HEADER} and none): the job's secret is needed")
    header, _ = parse_header(_recv_by(sock, hlen, deadline), 0)
    return header


def _recv_payload(sock: socket.socket, n: int):
    """``n`` payload bytes into a buffer whose pages are committed as the bytes arrive (np.empty touches no
    memory), so a peer that declares a large payload and stops holds only what it sent."""
    if not n:
        return bytearray()
    try:
        buf = np.empty(n, np.uint8)
    except MemoryError:
        raise FrameError(f"cannot allocate a payload of {n} bytes") from None
    _recv_into(sock, memoryview(buf))
    return buf


@contextmanager
def _stall_timeout(sock: socket.socket) -> Iterator[None]:
    """Within a frame, each read waits at most FRAME_STALL_S (or the socket's own shorter timeout)."""
    before = sock.gettimeout()
    if before is None or before > FRAME_STALL_S:
        sock.settimeout(FRAME_STALL_S)
    try:
        yield
    except TimeoutError:
        raise FrameError(f"peer stalled: no bytes for {FRAME_STALL_S:g} s in the middle of a frame") from None
    finally:
        if sock.gettimeout() != before:
            sock.settimeout(before)


_IOV_MAX = 512


def _sendall_vec(sock: socket.socket, bufs: list) -> int:
    """``sendall`` of several buffers with gather writes (``sendmsg``).

    One ``sendall`` per array would put every small block in its own TCP
    segment (``TCP_NODELAY``) and cost a system call each: a migration of 129
    blocks of 390 floats took ~3x longer than one gathered write.
    """
    views = [memoryview(b).cast("B") for b in bufs]
    views = [v for v in views if v.nbytes]
    total = sum(v.nbytes for v in views)
    if not hasattr(sock, "sendmsg"):  # pragma: no cover - non-POSIX
        for v in views:
            sock.sendall(v)
        return total
    i = 0
    while i < len(views):
        sent = sock.sendmsg(views[i:i + _IOV_MAX])
        while sent > 0:
            if sent >= views[i].nbytes:
                sent -= views[i].nbytes
                i += 1
            else:
                views[i] = views[i][sent:]
                sent = 0
    return total


def send_msg(sock: socket.socket, header: dict, arrays: Arrays | None = None) -> int:
    """Send one frame; returns the number of bytes written."""
    return _sendall_vec(sock, encode(header, arrays))


def recv_msg(sock: socket.socket) -> tuple[dict, Arrays]:
    """Receive one frame; raises ConnectionError on EOF, FrameError (a ProtocolError) on garbage.

    The prefix's lengths are bounded before the header is read, and the header is checked against the
    payload length before the payload is read."""
    magic, hlen, plen = _PREFIX.unpack(bytes(_recv_exact(sock, _PREFIX.size)))
    if magic != MAGIC:
        raise FrameError(f"bad magic {magic!r}")
    if hlen > MAX_HEADER:
        raise FrameError(f"frame too large: header of {hlen} bytes, at most {MAX_HEADER}")
    if plen > MAX_PAYLOAD:
        raise FrameError(f"frame too large: payload of {plen} bytes, at most {MAX_PAYLOAD}")
    with _stall_timeout(sock):
        header, specs = parse_header(bytes(_recv_exact(sock, hlen)), plen)
        payload = _recv_payload(sock, plen)
    return header, _arrays(specs, payload)


def parse_addr(addr: str | tuple) -> tuple[str, int]:
    if isinstance(addr, tuple):
        return addr[0], int(addr[1])
    host, _, port = addr.rpartition(":")
    return host, int(port)


def fmt_addr(addr: tuple[str, int]) -> str:
    return f"{addr[0]}:{addr[1]}"


def node_address(hostname: str | None = None) -> str:
    """The address to bind on a cluster node: what its hostname resolves to (so the port is not open on the
    node's other networks), or ``0.0.0.0`` when that is a loopback address or does not resolve."""
    try:
        ip = socket.gethostbyname(hostname or socket.gethostname())
    except OSError:
        return "0.0.0.0"
    return "0.0.0.0" if ip.startswith("127.") else ip


def _show_peer(peer: Any) -> str:
    return fmt_addr(peer) if isinstance(peer, tuple) else str(peer)


class Client:
    """A request/response connection to one peer (thread-safe, reconnects lazily).

    ``auth``: the credentials to authenticate with (the handshake of :mod:`.auth`, both ways); without them
    a peer that asks for authentication is an AuthError."""

    def __init__(self, addr: str | tuple, timeout: float | None = 120.0, auth: Credentials | None = None):
        self.addr = parse_addr(addr)
        self.timeout = timeout
        self.auth = auth
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._last_use = 0.0

    def _connect(self) -> socket.socket:
        """A connected (and, with credentials, authenticated) socket. A server that turns the connection away
        before its challenge (its strangers' pool is full, dl2d.core.listener) is tried again, with growing
        pauses, for about HANDSHAKE_TIMEOUT_S."""
        give_up = time.monotonic() + HANDSHAKE_TIMEOUT_S
        pause = 0.05
        while True:
            s = socket.create_connection(self.addr, timeout=self.timeout)
            try:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if self.auth is not None:
                    self._handshake(s)
                    s.settimeout(self.timeout)
                return s
            except _TurnedAway:
                s.close()
                if time.monotonic() + pause > give_up:
                    raise AuthError(f"{fmt_addr(self.addr)}: the server turned every connection away for "
                                    f"{HANDSHAKE_TIMEOUT_S:g} s (too many connections in its handshake)") from None
                time.sleep(pause)
                pause = min(2 * pause, 1.0)
            except BaseException:
                s.close()
                raise

    def _handshake(self, s: socket.socket) -> None:
        where = fmt_addr(self.addr)
        deadline = time.monotonic() + HANDSHAKE_TIMEOUT_S
        try:
            try:
                first = recv_handshake(s, deadline)
            except ConnectionError:  # closed before any challenge: turned away, not refused
                raise _TurnedAway() from None
            server_nonce = A.read_challenge(first)
            client_nonce = secrets.token_bytes(A.NONCE_BYTES)
            send_msg(s, A.answer(self.auth, server_nonce, client_nonce))
            A.check_verdict(recv_handshake(s, deadline), self.auth, server_nonce, client_nonce)
        except AuthError as e:
            raise AuthError(f"{where}: {e}") from None
        except TimeoutError:
            raise AuthError(f"{where}: no authentication handshake within {HANDSHAKE_TIMEOUT_S:g} s") from None
        except (ConnectionError, FrameError) as e:
            raise AuthError(f"{where}: authentication handshake failed: {e}") from None

    def call(self, op: str, arrays: Arrays | None = None, **fields: Any) -> tuple[dict, Arrays]:
        """Send request ``op`` and return ``(reply_header, reply_arrays)``.

        Raises :class:`RemoteError` when the peer answers ``ok: false``, :class:`AuthError` when the
        authentication fails.
        """
        with self._lock:
            if self._sock is not None and time.monotonic() - self._last_use > IDLE_TIMEOUT_S / 2:
                self._close_locked()  # the server may be about to drop it as idle
            if self._sock is None:
                self._sock = self._connect()
            try:
                send_msg(self._sock, {"op": op, **fields}, arrays)
                header, arr = recv_msg(self._sock)
            except BaseException:
                self._close_locked()
                raise
            self._last_use = time.monotonic()
            if header.get("op") == "AUTH_CHALLENGE":
                self._close_locked()
                raise AuthError(f"{fmt_addr(self.addr)} asks for authentication: the job's secret is needed")
        if not header.get("ok", False):
            raise RemoteError(f"{op} -> {header.get('error', 'unknown error')}")
        return header, arr

    def _close_locked(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None

    def close(self) -> None:
        with self._lock:
            self._close_locked()


class _TurnedAway(Exception):
    """The server closed a new connection before its challenge: too many strangers in its handshake."""


def handshake_limits() -> Limits:
    """The strangers' pool of a server (dl2d.core.listener.decide), from this module's bounds."""
    return Limits(total=MAX_HANDSHAKES, per_peer=MAX_HANDSHAKES_PER_PEER)


def _refusal_reason(e: Refused) -> str:
    if e.refusal == "peer":
        return f"{MAX_HANDSHAKES_PER_PEER} connections from this address are already authenticating"
    if e.refusal == "threads":
        return str(e)
    return f"{MAX_HANDSHAKES} connections are already authenticating"


class Server:
    """Threaded TCP server: ``handler(header, arrays)`` returns a reply.

    The handler returns either a dict (reply header) or ``(header, arrays)``;
    ``"ok": True`` is added when absent.  An exception becomes
    ``{"ok": false, "error": ...}``.

    ``auth``: every connection must first pass the handshake of :mod:`.auth` with one of these keys (else one
    log line and the connection is closed); ``with_peer``: the handler is called as ``handler(header, arrays,
    peer)`` with the :class:`Peer` (its authenticated role) that sent the request.
    """

    def __init__(self, handler: Handler, host: str = "127.0.0.1", port: int = 0,
                 advertise_host: str | None = None, *, auth: Credentials | None = None, with_peer: bool = False):
        self.handler = handler
        self.auth = auth
        self.with_peer = with_peer
        self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lsock.bind((host, port))
        self._lsock.listen(128)
        port = self._lsock.getsockname()[1]
        adv = advertise_host or (host if host not in ("0.0.0.0", "") else socket.gethostname())
        self.address = f"{adv}:{port}"
        self._closed = threading.Event()
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._strangers = PeerLimiter(handshake_limits())  # connections in the handshake
        self._log_window = (0.0, 0, 0)  # (window start, lines logged, lines left out)
        self.refused = 0  # connections refused (handshake failed or too many at once)
        self._thread = threading.Thread(target=self._accept_loop, daemon=True, name=f"srv-{port}")

    def start(self) -> "Server":
        self._thread.start()
        return self

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, peer = self._lsock.accept()
            except OSError:
                break
            ticket = None
            if self.auth is not None:
                try:
                    ticket = self._strangers.admit(peer[0], deadline_s=HANDSHAKE_TIMEOUT_S,
                                                   wake=lambda c=conn: shut_reads(c), limits=handshake_limits())
                except Refused as e:
                    self._refuse(peer, _refusal_reason(e))
                    conn.close()
                    continue
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._conns_lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn, peer, ticket), daemon=True).start()

    @property
    def _handshakes(self) -> int:
        """Connections in the handshake now."""
        return self._strangers.in_use

    def _refuse(self, peer: Any, why: str) -> None:
        """One warning line per refused connection, at most MAX_REFUSAL_LINES per 10 s (then a count)."""
        now = time.monotonic()
        with self._conns_lock:
            self.refused += 1
            start, lines, left_out = self._log_window
            if now - start > 10.0:
                start, lines, left_out = now, 0, left_out
            if lines >= MAX_REFUSAL_LINES:
                self._log_window = (start, lines, left_out + 1)
                return
            self._log_window = (start, lines + 1, 0)
        more = f" ({left_out} more refused connections not logged)" if left_out else ""
        log.warning("%s: refused the connection from %s: %s%s", self.address, _show_peer(peer), why, more)

    def _handshake(self, conn: socket.socket, peer: Any, ticket: Ticket) -> str | None:
        """The server side of the handshake: the peer's role, or None (logged, the caller closes). All of it
        by the ticket's deadline (brought forward if a newer connection takes this one's place)."""
        assert self.auth is not None
        deadline = ticket.deadline.end
        server_nonce = secrets.token_bytes(A.NONCE_BYTES)
        try:
            send_msg(conn, A.challenge(server_nonce))
            header = recv_handshake(conn, deadline)
            role, client_nonce = A.check_answer(header, self.auth.keys, server_nonce)
            send_msg(conn, A.verdict(self.auth.keys, role, server_nonce, client_nonce))
            return role
        except AuthError as e:
            why = str(e)
            try:  # say so to an honest client with the wrong secret (nothing here is secret)
                send_msg(conn, {"ok": False, "error": "authentication failed: the job's secret is needed"})
            except OSError:
                pass
        except TimeoutError:
            why = f"no authentication within {HANDSHAKE_TIMEOUT_S:g} s"
        except FrameError as e:
            why = f"bad handshake frame: {e}"
        except (ConnectionError, OSError) as e:
            why = f"closed during the handshake ({type(e).__name__})"
        if ticket.replaced:
            why = (f"no answer to the challenge after {handshake_limits().grace_s:g} s, and a newer connection "
                   "needed its place")
        self._refuse(peer, why)
        return None

    def _serve(self, conn: socket.socket, peer: Any = None, ticket: Ticket | None = None) -> None:
        role = None
        try:
            if self.auth is not None:
                assert ticket is not None  # every connection of an authenticating server has one
                try:
                    role = self._handshake(conn, peer, ticket)
                finally:
                    ticket.release()  # authenticated or not, it is no stranger in the handshake any more
                if role is None:
                    return
            conn.settimeout(IDLE_TIMEOUT_S)
            who = Peer(_show_peer(peer), role)
            while not self._closed.is_set():
                try:
                    header, arrays = recv_msg(conn)
                except ProtocolError as e:  # garbage: one line, and this connection is closed
                    log.warning("%s: closed the connection from %s: %s", self.address, who.address, e)
                    break
                except (ConnectionError, OSError):  # EOF, reset, or idle for IDLE_TIMEOUT_S
                    break
                try:
                    out = self.handler(header, arrays, who) if self.with_peer else self.handler(header, arrays)
                    rh, ra = (out if isinstance(out, tuple) else (out, None))
                    rh = dict(rh or {})
                    rh.setdefault("ok", True)
                except Exception as e:  # reported to the peer, server keeps going
                    rh, ra = {"ok": False, "error": f"{type(e).__name__}: {e}"}, None
                try:
                    frame = encode(rh, ra)
                except (ProtocolError, TypeError, ValueError) as e:  # a reply that cannot be sent: say why
                    frame = encode({"ok": False, "error": f"reply not sent: {type(e).__name__}: {e}"})
                try:
                    _sendall_vec(conn, frame)
                except OSError:
                    break
        finally:
            with self._conns_lock:
                self._conns.discard(conn)
            try:
                conn.close()
            except OSError:
                pass

    def close(self) -> None:
        self._closed.set()
        try:
            self._lsock.shutdown(socket.SHUT_RDWR)  # wakes the accept loop (a close alone leaves it blocked)
        except OSError:
            pass
        try:
            self._lsock.close()
        except OSError:
            pass
        with self._conns_lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
