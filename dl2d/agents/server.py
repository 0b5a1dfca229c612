"""HTTP endpoint of the node agent (pull model: the daemon polls).

``GET /v1/stats`` -> the sample JSON; needs ``Authorization: Bearer <token>``.
``GET /healthz``  -> ``{"ok": true}``; no token, no data (for load balancers
and systemd checks). Everything else is 404; a missing or wrong token is 401.

The endpoint faces the cluster network, so it is bounded as a server on the internet would be
(:mod:`dl2d.core.listener`): one deadline for a whole request and its answer, at most a few connections per
remote address, a refused connection answered 503 by the accepting thread, and a stranger that holds a
connection without finishing its request gives its place to the next client that does (the daemon's poll).
"""

from __future__ import annotations

import hmac
from typing import Callable

from dl2d.core.files import MIN_SECRET_CHARS, SecretFileError, read_secret_file
from dl2d.core.listener import BoundedHTTPHandler, BoundedHTTPServer, Limits

__all__ = ["TokenFileError", "check_bearer", "load_token", "make_server"]


#: the shortest shared token accepted: a guessable token is no authentication
MIN_TOKEN_CHARS = MIN_SECRET_CHARS
#: Seconds from a connection's accept to its answer, all reads and writes together: a client that stalls or
#: trickles its request a byte at a time is dropped then. The daemon's poll sends its request at once and
#: gives up after its own 2 s.
REQUEST_TIMEOUT_S = 5.0
#: Connections served at once; more are answered 503 and closed by the accepting thread (no thread each).
MAX_CONNECTIONS = 32
#: Connections of one remote address at once. A newer one takes the place of the oldest that has not sent its
#: request after a second (dl2d.core.listener), so strangers that hold connections open lose them to the
#: daemon's next poll rather than lock it out.
MAX_PER_PEER = 8


class TokenFileError(Exception):
    """The token file is missing, empty or too permissive."""


def load_token(path: str) -> str:
    """Read the shared token, refusing a file that group or others can access.

    The file must be a regular file of mode 0600 or 0400 (``chmod 600``),
    owned by root or by the user running the agent (the check is
    :func:`dl2d.core.files.read_secret_file`, shared with the elastic jobs' secret).
    """
    try:
        return read_secret_file(path, what="token file", owner_desc="the agent's user")
    except SecretFileError as e:
        raise TokenFileError(str(e)) from None


def check_bearer(header: str | None, token: str) -> bool:
    """Constant-time check of an ``Authorization`` header value."""
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[7:].strip().encode(), token.encode())


def make_server(
    bind: str, port: int, token: str, stats_json: Callable[[], bytes],
    timeout: float = REQUEST_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS, per_peer: int = MAX_PER_PEER,
) -> BoundedHTTPServer:
    """An HTTP server (not yet serving) that answers with ``stats_json()``. Every connection has ``timeout``
    seconds for its whole request and answer; at most ``max_connections`` are served at once and ``per_peer``
    of them from one address (dl2d.core.listener's rules: a refused connection costs no thread, one that has
    not sent its request yields its place to a newer one)."""

    class Handler(BoundedHTTPHandler):
        server_version = "dl2-agent"

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                self._send(200, b'{"ok":true}')
            elif path == "/v1/stats":
                if not check_bearer(self.headers.get("Authorization"), token):
                    self._send(401, b'{"error":"unauthorized"}',
                               {"WWW-Authenticate": 'Bearer realm="dl2-agent"'})
                    return
                try:
                    body = stats_json()
                except Exception as e:  # never let a reader bug kill the agent
                    self._send(500, ('{"error":%r}' % type(e).__name__).encode())
                    return
                self._send(200, body)
            else:
                self._send(404, b'{"error":"not found"}')

        def _send(self, code: int, body: bytes, extra: dict[str, str] | None = None) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body)

    limits = Limits(total=max_connections, per_peer=per_peer)
    return BoundedHTTPServer((bind, port), Handler, limits=limits, deadline_s=timeout)
