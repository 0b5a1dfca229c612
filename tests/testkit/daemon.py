"""Helpers of the daemon tests: a systemd notify socket that records what the daemon sends."""
from __future__ import annotations

import socket
import threading


class NotifySocket:
    """A unix datagram socket at ``path`` read by a thread, as systemd does: ``msgs`` holds every message."""

    def __init__(self, path: str):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.msgs: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                self.msgs.append(self.sock.recv(4096).decode())
            except OSError:  # closed
                return

    def close(self) -> None:
        self.sock.close()
