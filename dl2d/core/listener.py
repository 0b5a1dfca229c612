"""Listeners bounded like servers on the internet: one deadline for a whole request, a fair share of the
connections for each peer, room that strangers cannot fill, and a fixed bound on the threads.

A fixed count of connection slots with a timeout per read is not a bound: a client that sends one byte
before each read times out holds its slot (and its thread) for as long as it likes, and a few dozen such
clients hold them all. Every dl2d listener (the node agent's HTTP endpoint, the daemon's control socket and
metrics endpoint, the elastic runtime's servers in their unauthenticated phase) is therefore built from:

- :class:`Deadline` / :class:`DeadlineIO`: the reads of a request (and the writes of its answer) share one
  deadline, set when the connection is accepted;
- :func:`decide`: the admission of a new connection, a pure function of who holds the slots. A peer (a
  remote address, or a uid on a Unix socket) holds at most ``per_peer`` connections; ``reserved`` of the
  ``total`` slots are for privileged peers only. When a newcomer finds no room, it may take the place of a
  connection that has not finished sending its request (a *pending* one): its own peer's oldest, once that
  has had ``grace_s`` to send it, or one of a peer that holds more than its fair share. Slow clients thus
  keep a newcomer out for the grace at most, while a burst of honest clients from one address does not push
  out its own members;
- :class:`PeerLimiter`: that decision kept under a lock, with the admitted connections as tickets;
  a replaced connection's reads end at once (its socket's read side is shut), and threads (admitted
  connections plus replaced ones still ending) never exceed twice ``total``. A refused connection is
  closed by the accepting thread: it costs no thread.
- :class:`BoundedServerMixIn` and :class:`DeadlineHandlerMixIn`: the shell of the above for
  :mod:`socketserver` servers, and :class:`BoundedHTTPServer` / :class:`BoundedHTTPHandler` for
  :mod:`http.server`: one request per connection, an HTTP 503 to a refused one.

Only the standard library: ``dl2d.core`` imports nothing else of dl2d.
"""
from __future__ import annotations

import http.server
import io
import socket
import sys
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["BoundedHTTPHandler", "BoundedHTTPServer", "BoundedServerMixIn", "Deadline", "DeadlineHandlerMixIn",
           "DeadlineIO", "Decision", "Held", "Limits", "PeerLimiter", "Refused", "Ticket", "decide", "shut_reads"]

#: A reply may take at least this long to write even when the request used up its deadline: an answer to a
#: client that is reading must not be cut, and one that does not read holds its slot this much longer only.
WRITE_MIN_S = 2.0


@dataclass(frozen=True)
class Limits:
    """How many connections a listener admits at once, and how they are shared.

    ``total``: connections admitted at once (being read or being answered); ``per_peer``: of them from one
    peer; ``reserved``: of ``total``, slots only privileged peers may take; ``grace_s``: how long a pending
    connection has to send its request before a newer one from its own peer may take its place (a burst of
    honest clients from one address does not replace its own members)."""

    total: int
    per_peer: int
    reserved: int = 0
    grace_s: float = 1.0

    def __post_init__(self) -> None:
        if self.total < 1 or self.per_peer < 1:
            raise ValueError(f"total and per_peer must be >= 1, got {self.total} and {self.per_peer}")
        if not 0 <= self.reserved < self.total:
            raise ValueError(f"reserved must be in 0..total-1, got {self.reserved} of {self.total}")
        if self.grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {self.grace_s}")

    @property
    def thread_cap(self) -> int:
        """Threads at most: the admitted connections and as many replaced ones still ending."""
        return 2 * self.total


@dataclass(frozen=True)
class Held:
    """What the admission decision sees of one admitted connection."""

    peer: Hashable
    privileged: bool
    pending: bool  # still sending its request: it may be replaced
    since: float  # when it was admitted (the limiter's clock)


@dataclass(frozen=True)
class Decision:
    """Admit the newcomer (taking the place of ``held[victim]`` when that is not None), or refuse it:
    ``refusal`` is ``"peer"`` (its peer holds its share) or ``"full"`` (no slot it may take). (A
    :class:`Refused` may also say ``"threads"``: the limiter's bound on threads.)"""

    admit: bool
    victim: int | None = None
    refusal: str = ""


def _oldest(held: Sequence[Held], indices: list[int]) -> int | None:
    return min(indices, key=lambda i: held[i].since) if indices else None


def _heaviest_oldest(held: Sequence[Held], counts: dict, indices: list[int]) -> int | None:
    """Of ``indices``, the oldest connection of the peer that holds the most."""
    if not indices:
        return None
    most = max(counts[held[i].peer] for i in indices)
    return _oldest(held, [i for i in indices if counts[held[i].peer] == most])


def decide(held: Sequence[Held], peer: Hashable, privileged: bool, now: float, limits: Limits) -> Decision:
    """Whether a new connection from ``peer`` is admitted, given the connections ``held``; pure.

    1. Room for it (its peer holds fewer than ``per_peer``; fewer than ``total`` are held, less the
       ``reserved`` slots for an unprivileged peer): admitted.
    2. Its peer holds its share: it replaces its peer's oldest pending connection that has had ``grace_s``,
       or is refused (``"peer"``).
    3. No free slot it may take: it replaces a pending connection of an unprivileged peer, the oldest of the
       peer holding the most, if it is privileged, or if that peer holds at least two more than its own (after
       the swap it still holds as many), at any age; else (unprivileged) the oldest pending connection that
       has had ``grace_s`` of a peer holding more than its own, or of its own peer; else it is refused
       (``"full"``). Replacing one must make room: with privileged peers in the reserved slots, an
       unprivileged newcomer may find none.

    So strangers keep out a newcomer that holds fewer connections than they do for ``grace_s`` at most,
    however many addresses they use, and one peer's burst of honest clients does not push out its own
    members before they have sent a request.
    """
    mine = [i for i, h in enumerate(held) if h.peer == peer]
    room = limits.total if privileged else limits.total - limits.reserved
    own_aged = [i for i in mine if held[i].pending and now - held[i].since >= limits.grace_s]
    if len(mine) >= limits.per_peer:
        victim = _oldest(held, own_aged)
        return Decision(True, victim) if victim is not None else Decision(False, refusal="peer")
    if len(held) < room:
        return Decision(True)
    if len(held) - 1 >= room:  # one slot less would still leave none this newcomer may take
        return Decision(False, refusal="full")
    counts: dict[Hashable, int] = {}
    for h in held:
        if not h.privileged:
            counts[h.peer] = counts.get(h.peer, 0) + 1
    others = [i for i, h in enumerate(held) if h.pending and not h.privileged and h.peer != peer]
    if privileged:
        victim = _heaviest_oldest(held, counts, others)
    else:
        victim = _heaviest_oldest(held, counts, [i for i in others if counts[held[i].peer] >= len(mine) + 2])
        if victim is None:
            victim = _oldest(held, [i for i in others if counts[held[i].peer] > len(mine)
                                    and now - held[i].since >= limits.grace_s] + own_aged)
    if victim is None and privileged:
        victim = _oldest(held, own_aged)
    return Decision(True, victim) if victim is not None else Decision(False, refusal="full")


class Deadline:
    """The moment by which a request must be in (and its answer out); ``cut`` brings it to now."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self.end = clock() + seconds

    def left(self) -> float:
        return self.end - self._clock()

    @property
    def expired(self) -> bool:
        return self.left() <= 0

    def cut(self) -> None:
        self.end = min(self.end, self._clock())


class DeadlineIO(io.RawIOBase):
    """A connected socket as a raw stream whose reads all end by one :class:`Deadline` (TimeoutError after
    it); writes get what is left of it, at least :data:`WRITE_MIN_S`. Closing it leaves the socket open."""

    def __init__(self, sock: socket.socket, deadline: Deadline, write_min_s: float = WRITE_MIN_S) -> None:
        super().__init__()
        self.sock = sock
        self.deadline = deadline
        self.write_min_s = write_min_s

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def _timeout(self) -> TimeoutError:
        return TimeoutError(f"request not complete within {self.deadline.seconds:g} s")

    def readinto(self, buffer: bytearray | memoryview) -> int:
        left = self.deadline.left()
        if left <= 0:
            raise self._timeout()
        self.sock.settimeout(left)
        try:
            n = self.sock.recv_into(buffer)
        except TimeoutError:
            raise self._timeout() from None
        if n == 0 and self.deadline.expired:  # its read side was shut because it was replaced
            raise self._timeout()
        return n

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.sock.settimeout(max(self.deadline.left(), self.write_min_s))
        self.sock.sendall(data)  # (a socket timeout bounds the whole sendall)
        return memoryview(data).nbytes


class Refused(Exception):
    """A connection the limiter does not admit; the message says why (for a log line)."""

    def __init__(self, why: str, refusal: str) -> None:
        super().__init__(why)
        self.refusal = refusal


class Ticket:
    """One admitted connection: its peer, its deadline, whether it is still pending (may be replaced)."""

    def __init__(self, limiter: "PeerLimiter", peer: Hashable, privileged: bool, since: float,
                 deadline: Deadline, wake: Callable[[], None]) -> None:
        self._limiter = limiter
        self.peer = peer
        self.privileged = privileged
        self.since = since
        self.deadline = deadline
        self.pending = True
        self.replaced = False
        self._wake = wake

    def answering(self) -> None:
        """The request is in: from now on the connection is being answered and keeps its slot."""
        with self._limiter._lock:
            self.pending = False

    def release(self) -> None:
        """The connection is done (its thread ends); idempotent."""
        self._limiter._release(self)


class PeerLimiter:
    """The admitted connections of one listener, and the admission of new ones by :func:`decide`."""

    def __init__(self, limits: Limits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self._clock = clock
        self._lock = threading.Lock()
        self._live: list[Ticket] = []  # admitted, not replaced, not released
        self._ending: set[Ticket] = set()  # replaced, their threads not yet done
        self.refused = 0
        self.replaced = 0

    @property
    def in_use(self) -> int:
        with self._lock:
            return len(self._live)

    @property
    def threads(self) -> int:
        """Connections that hold a thread: the admitted ones and the replaced ones still ending."""
        with self._lock:
            return len(self._live) + len(self._ending)

    def admit(self, peer: Hashable, *, privileged: bool = False, deadline_s: float,
              wake: Callable[[], None], limits: Limits | None = None) -> Ticket:
        """A ticket for a new connection from ``peer`` (``wake()`` ends its reads if it is replaced later),
        or :class:`Refused`. ``limits``: this call's, else the limiter's."""
        lim = limits or self.limits
        with self._lock:
            now = self._clock()
            if len(self._live) + len(self._ending) >= lim.thread_cap:
                self.refused += 1
                raise Refused(f"{lim.thread_cap} connections still hold a thread", "threads")
            held = [Held(t.peer, t.privileged, t.pending, t.since) for t in self._live]
            d = decide(held, peer, privileged, now, lim)
            if not d.admit:
                self.refused += 1
                why = (f"{lim.per_peer} connections from this peer are already open" if d.refusal == "peer"
                       else f"all {lim.total} connections are in use")
                raise Refused(why, d.refusal)
            victim = self._live.pop(d.victim) if d.victim is not None else None
            if victim is not None:
                victim.replaced = True
                victim.deadline.cut()
                self._ending.add(victim)
                self.replaced += 1
            ticket = Ticket(self, peer, privileged, now, Deadline(deadline_s, self._clock), wake)
            self._live.append(ticket)
        if victim is not None:
            try:
                victim._wake()
            except OSError:
                pass  # it is closing already
        return ticket

    def _release(self, ticket: Ticket) -> None:
        with self._lock:
            if ticket in self._live:
                self._live.remove(ticket)
            self._ending.discard(ticket)


def shut_reads(sock: socket.socket) -> None:
    """End a connection's pending and future reads (they see EOF), from another thread; its writes still
    work, so its handler may say why."""
    try:
        sock.shutdown(socket.SHUT_RD)
    except OSError:
        pass


class BoundedServerMixIn:
    """For a :mod:`socketserver` server (put it before the server class): each connection is admitted by a
    :class:`PeerLimiter` before a thread is started for it; a refused one is answered by
    :meth:`refuse_request` (a short, non-blocking write) and closed by the accepting thread.

    Subclasses say who a peer is (:meth:`peer_of`: by default the remote address) and may reword the
    refusal; the handler reads its :class:`Ticket` through :meth:`current_ticket`."""

    request_queue_size = 128  # socketserver's 5 refuses a burst of honest clients before they are seen

    def __init__(self, *args, limits: Limits, deadline_s: float, **kwargs) -> None:
        self.limiter = PeerLimiter(limits)
        self.deadline_s = deadline_s
        self._tickets = threading.local()
        super().__init__(*args, **kwargs)

    def peer_of(self, request: socket.socket, client_address: Any) -> tuple[Hashable, bool]:
        """(the peer's key, whether it is privileged): the remote host on TCP, none privileged."""
        return (client_address[0] if isinstance(client_address, tuple) else client_address), False

    def refuse_request(self, request: socket.socket, refused: Refused) -> None:
        """What a refused connection is told before it is closed (nothing, by default)."""

    def process_request(self, request: socket.socket, client_address: Any) -> None:
        try:
            peer, privileged = self.peer_of(request, client_address)
            ticket = self.limiter.admit(peer, privileged=privileged, deadline_s=self.deadline_s,
                                        wake=lambda: shut_reads(request))
        except (Refused, OSError) as e:
            refused = e if isinstance(e, Refused) else Refused(f"no peer credentials: {e}", "full")
            try:
                request.setblocking(False)
                self.refuse_request(request, refused)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            threading.Thread(target=self._serve_admitted, args=(request, client_address, ticket),
                             daemon=True).start()
        except RuntimeError:  # no thread to be had: as refused
            ticket.release()
            self.shutdown_request(request)

    def _serve_admitted(self, request: socket.socket, client_address: Any, ticket: Ticket) -> None:
        self._tickets.ticket = ticket
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            ticket.release()
            self.shutdown_request(request)

    def handle_error(self, request: socket.socket, client_address: Any) -> None:
        """A connection's I/O failing (reset, broken pipe, its deadline) is the client's business and not
        printed; anything else is (socketserver's traceback on stderr)."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)  # type: ignore[misc]

    def current_ticket(self) -> Ticket:
        """The ticket of the connection this thread serves."""
        return self._tickets.ticket


class DeadlineHandlerMixIn:
    """For a :class:`socketserver.StreamRequestHandler` of a :class:`BoundedServerMixIn` server: ``rfile``
    and ``wfile`` read and write through :class:`DeadlineIO` on the connection's ticket's deadline. The
    handler calls ``self.ticket.answering()`` once the whole request is in."""

    def setup(self) -> None:
        self.ticket: Ticket = self.server.current_ticket()  # type: ignore[attr-defined]
        self.connection = self.request  # type: ignore[attr-defined]
        raw = DeadlineIO(self.connection, self.ticket.deadline)
        self.rfile = io.BufferedReader(raw)
        self.wfile = raw

    def finish(self) -> None:
        for f in (self.wfile, self.rfile):
            try:
                f.close()
            except OSError:
                pass


class BoundedHTTPServer(BoundedServerMixIn, http.server.HTTPServer):
    """An HTTP server of :class:`BoundedServerMixIn`: a refused connection gets a 503 and is closed."""

    REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: 29\r\n"
               b"Retry-After: 1\r\nConnection: close\r\n\r\n{\"error\":\"too many requests\"}")

    def refuse_request(self, request: socket.socket, refused: Refused) -> None:
        request.send(self.REFUSAL)


class BoundedHTTPHandler(DeadlineHandlerMixIn, http.server.BaseHTTPRequestHandler):
    """A request handler for :class:`BoundedHTTPServer`: one request per connection (a kept-alive connection
    would outlive its deadline), its request line and headers read by the deadline, then answering."""

    protocol_version = "HTTP/1.1"

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self.close_connection = True
        if ok:
            self.ticket.answering()
        return ok

    def end_headers(self) -> None:
        if not any(line.lower().startswith(b"connection:") for line in getattr(self, "_headers_buffer", [])):
            self.send_header("Connection", "close")
        super().end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # a line per request, or per stalled stranger, is noise; the callers log what matters
