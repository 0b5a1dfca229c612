"""HTTP endpoint of the node agent (pull model: the daemon polls).

``GET /v1/stats`` -> the sample JSON; needs ``Authorization: Bearer <token>``.
``GET /healthz``  -> ``{"ok": true}``; no token, no data (for load balancers
and systemd checks). Everything else is 404; a missing or wrong token is 401.
"""

from __future__ import annotations

import hmac
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

from dl2d.core.files import MIN_SECRET_CHARS, SecretFileError, read_secret_file

__all__ = ["TokenFileError", "check_bearer", "load_token", "make_server"]


#: the shortest shared token accepted: a guessable token is no authentication
MIN_TOKEN_CHARS = MIN_SECRET_CHARS
#: seconds a connection may take to send its request (a client that connects and stalls is dropped)
REQUEST_TIMEOUT_S = 10.0
#: connections served at once; more are closed at once instead of each holding a thread
MAX_CONNECTIONS = 32


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
    timeout: float = REQUEST_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS,
) -> ThreadingHTTPServer:
    """An HTTP server (not yet serving) that answers with ``stats_json()``. Every connection gets ``timeout``
    seconds per read (a stalled client is dropped) and at most ``max_connections`` are served at once."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "dl2-agent"
        protocol_version = "HTTP/1.1"

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

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass  # one line per poll every 10 s is noise; errors surface in the daemon

    Handler.timeout = timeout  # socket timeout of every connection (StreamRequestHandler)
    srv = _BoundedServer((bind, port), Handler, max_connections)
    srv.daemon_threads = True
    return srv


class _BoundedServer(ThreadingHTTPServer):
    """A threading server that serves at most ``limit`` connections at once and closes the rest at once."""

    def __init__(self, address, handler, limit: int):
        self._slots = threading.BoundedSemaphore(limit)
        super().__init__(address, handler)

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()
