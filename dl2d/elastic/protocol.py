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

The transport is request/response: a client sends one request frame on a
connection and reads exactly one reply frame.  A server serves each accepted
connection in its own thread, so a handler may block (for instance a
synchronous-mode ``PULL`` waiting for the next model version) without holding
up other peers.
"""

from __future__ import annotations

import json
import math
import socket
import struct
import threading
from typing import Any, Callable

import numpy as np

MAGIC = b"DL2E"
_PREFIX = struct.Struct("!4sIQ")
MAX_HEADER = 16 * 1024 * 1024
MAX_PAYLOAD = 8 * 1024**3
_DTYPE = np.dtype("<f4")

Arrays = dict[str, np.ndarray]
Handler = Callable[[dict, Arrays], "tuple[dict, Arrays | None] | dict"]


class ProtocolError(Exception):
    """Malformed frame on the wire."""


class RemoteError(Exception):
    """The peer answered with ``ok: false``."""


def encode(header: dict, arrays: Arrays | None = None) -> list[bytes | memoryview]:
    """Encode a frame as a list of buffers (header prefix + array buffers)."""
    header = dict(header)
    bufs: list[memoryview] = []
    specs = []
    total = 0
    for name, arr in (arrays or {}).items():
        a = np.ascontiguousarray(arr, dtype=_DTYPE)
        specs.append({"name": name, "dtype": "float32", "shape": list(a.shape)})
        mv = memoryview(a).cast("B")
        bufs.append(mv)
        total += mv.nbytes
    if specs:
        header["arrays"] = specs
    hb = json.dumps(header, separators=(",", ":")).encode("utf-8")
    if len(hb) > MAX_HEADER:
        raise ProtocolError("header too large")
    return [_PREFIX.pack(MAGIC, len(hb), total) + hb, *bufs]


def decode(header_bytes: bytes, payload: bytearray | bytes) -> tuple[dict, Arrays]:
    try:
        header = json.loads(header_bytes.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ProtocolError(f"bad header: {e}") from None
    if not isinstance(header, dict):
        raise ProtocolError("header is not a JSON object")
    arrays: Arrays = {}
    off = 0
    for spec in header.pop("arrays", []):
        if spec.get("dtype") != "float32":
            raise ProtocolError(f"unsupported dtype {spec.get('dtype')!r}")
        shape = tuple(int(s) for s in spec["shape"])
        if any(s < 0 for s in shape):
            raise ProtocolError(f"negative dimension in {shape}")
        n = math.prod(shape)  # (np.prod costs ~10x more; frames carry hundreds of blocks)
        nbytes = n * 4
        if off + nbytes > len(payload):
            raise ProtocolError("payload shorter than declared arrays")
        a = np.frombuffer(payload, dtype=_DTYPE, count=n, offset=off)
        arrays[spec["name"]] = a if len(shape) == 1 else a.reshape(shape)
        off += nbytes
    if off != len(payload):
        raise ProtocolError("payload longer than declared arrays")
    return header, arrays


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    mv = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(mv[got:], min(n - got, 1 << 22))
        if k == 0:
            raise ConnectionError("connection closed")
        got += k
    return buf


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
    """Receive one frame; raises ConnectionError on EOF, ProtocolError on garbage."""
    magic, hlen, plen = _PREFIX.unpack(bytes(_recv_exact(sock, _PREFIX.size)))
    if magic != MAGIC:
        raise ProtocolError(f"bad magic {magic!r}")
    if hlen > MAX_HEADER or plen > MAX_PAYLOAD:
        raise ProtocolError("frame too large")
    hb = bytes(_recv_exact(sock, hlen))
    payload = _recv_exact(sock, plen) if plen else bytearray()
    return decode(hb, payload)


def parse_addr(addr: str | tuple) -> tuple[str, int]:
    if isinstance(addr, tuple):
        return addr[0], int(addr[1])
    host, _, port = addr.rpartition(":")
    return host, int(port)


def fmt_addr(addr: tuple[str, int]) -> str:
    return f"{addr[0]}:{addr[1]}"


class Client:
    """A request/response connection to one peer (thread-safe, reconnects lazily)."""

    def __init__(self, addr: str | tuple, timeout: float | None = 120.0):
        self.addr = parse_addr(addr)
        self.timeout = timeout
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def _connect(self) -> socket.socket:
        s = socket.create_connection(self.addr, timeout=self.timeout)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def call(self, op: str, arrays: Arrays | None = None, **fields: Any) -> tuple[dict, Arrays]:
        """Send request ``op`` and return ``(reply_header, reply_arrays)``.

        Raises :class:`RemoteError` when the peer answers ``ok: false``.
        """
        with self._lock:
            if self._sock is None:
                self._sock = self._connect()
            try:
                send_msg(self._sock, {"op": op, **fields}, arrays)
                header, arr = recv_msg(self._sock)
            except BaseException:
                self._close_locked()
                raise
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


class Server:
    """Threaded TCP server: ``handler(header, arrays)`` returns a reply.

    The handler returns either a dict (reply header) or ``(header, arrays)``;
    ``"ok": True`` is added when absent.  An exception becomes
    ``{"ok": false, "error": ...}``.
    """

    def __init__(self, handler: Handler, host: str = "127.0.0.1", port: int = 0,
                 advertise_host: str | None = None):
        self.handler = handler
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
        self._thread = threading.Thread(target=self._accept_loop, daemon=True, name=f"srv-{port}")

    def start(self) -> "Server":
        self._thread.start()
        return self

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._lsock.accept()
            except OSError:
                break
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._conns_lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            while not self._closed.is_set():
                try:
                    header, arrays = recv_msg(conn)
                except (ConnectionError, OSError, ProtocolError):
                    break
                try:
                    out = self.handler(header, arrays)
                    rh, ra = (out if isinstance(out, tuple) else (out, None))
                    rh = dict(rh or {})
                    rh.setdefault("ok", True)
                except Exception as e:  # reported to the peer, server keeps going
                    rh, ra = {"ok": False, "error": f"{type(e).__name__}: {e}"}, None
                try:
                    send_msg(conn, rh, ra)
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
