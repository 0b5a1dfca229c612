"""sd_notify without a dependency: datagrams to ``$NOTIFY_SOCKET`` (systemd ``Type=notify``).

Messages: ``READY=1`` once the daemon is serving, ``STATUS=...`` after each slot, ``WATCHDOG=1`` at least
every half ``WatchdogSec`` (``$WATCHDOG_USEC``), ``STOPPING=1`` on shutdown. Outside systemd (no
``NOTIFY_SOCKET``) every call is a no-op. An abstract socket is written ``@name``.
"""
from __future__ import annotations

import os
import socket
import time
from typing import Mapping


class Notifier:
    def __init__(self, env: Mapping[str, str] | None = None):
        env = os.environ if env is None else env
        addr = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + addr[1:] if addr.startswith("@") else addr
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        ok_pid = not pid or (pid.isdigit() and int(pid) == os.getpid())
        self.watchdog_s = int(usec) / 1e6 if usec.isdigit() and int(usec) > 0 and ok_pid else None
        self._last_ping = 0.0

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *lines: str) -> bool:
        """Send one datagram (lines joined by newlines); False when not under systemd, on error, or when the
        receiver's queue is full (the message is dropped: a stalled systemd must not stall scheduling)."""
        if not self.address:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.setblocking(False)  # a full receiver queue drops the message, never stalls the slot loop
                s.connect(self.address)
                s.sendall("\n".join(lines).encode())
            return True
        except OSError:
            return False

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")

    def ping(self, force: bool = False) -> bool:
        """WATCHDOG=1, at most every watchdog/4 seconds (cheap to call from any wait loop)."""
        if self.watchdog_s is None:
            return False
        now = time.monotonic()
        if not force and now - self._last_ping < self.watchdog_s / 4:
            return False
        self._last_ping = now
        return self.send("WATCHDOG=1")

    @property
    def max_sleep(self) -> float:
        """Longest a wait loop may sleep between pings."""
        return self.watchdog_s / 4 if self.watchdog_s else 3600.0
