"""Concurrent poller of node agents, with stale-node detection.

One round fetches ``GET /v1/stats`` from every agent at once (asyncio, raw
HTTP/1.1 over ``asyncio.open_connection``: no thread per node, no client
library), each request bounded by ``timeout`` seconds. An agent that turns the
poll away (HTTP 503, or the connection closed before any answer: its bound on
connections from one address) is asked again within the same ``timeout``.
A node that fails ``stale_after`` consecutive rounds is reported stale once,
through ``on_stale(node, reason)``; its first good answer afterwards reports it
recovered through ``on_recover(node)``. If a callback raises, the state change
is not committed and is retried on the next round.

Stale means the *agent* is silent, nothing more: an agent can be made silent by
anyone who can reach its port, so the daemon records it (an event, the
``dl2d_stale_nodes`` metric, ``stale`` in ``dl2ctl nodes``) and never drains
the node for it; scheduling goes on on Slurm's own node state
(``dl2d.daemon.agent_rounds``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal
from urllib.parse import urlsplit

__all__ = ["PollResult", "PollRound", "Poller", "StaleTracker", "Transition", "fetch_json"]

log = logging.getLogger(__name__)

MAX_BODY = 4 * 1024 * 1024  # a 16-GPU sample is ~10 KiB; refuse anything absurd
SCHEMA_VERSION = 1


class PollError(Exception):
    pass


@dataclass(frozen=True)
class PollResult:
    node: str
    sample: dict[str, Any] | None
    error: str | None
    latency_s: float


@dataclass(frozen=True)
class Transition:
    node: str
    kind: Literal["stale", "recovered"]
    reason: str = ""


@dataclass
class PollRound:
    results: list[PollResult]
    transitions: list[Transition]  # committed (callback succeeded or absent)
    wall_s: float
    failed_transitions: list[Transition] = field(default_factory=list)

    @property
    def samples(self) -> dict[str, dict[str, Any]]:
        return {r.node: r.sample for r in self.results if r.sample is not None}

    @property
    def errors(self) -> dict[str, str]:
        return {r.node: r.error for r in self.results if r.error is not None}


class StaleTracker:
    """Consecutive-miss counter per node; pure state, no I/O.

    :meth:`observe` proposes a transition; :meth:`commit` applies it once the
    side effect (drain/resume) has succeeded.
    """

    def __init__(self, stale_after: int) -> None:
        if stale_after < 1:
            raise ValueError("stale_after must be >= 1")
        self.stale_after = stale_after
        self.misses: dict[str, int] = {}
        self.last_error: dict[str, str] = {}
        self.stale: set[str] = set()

    def observe(self, node: str, ok: bool, error: str | None = None) -> Transition | None:
        if ok:
            self.misses[node] = 0
        else:
            self.misses[node] = self.misses.get(node, 0) + 1
            self.last_error[node] = error or "no answer"
        silent = self.misses[node] >= self.stale_after
        if silent and node not in self.stale:
            reason = (f"dl2d: agent silent for {self.misses[node]} polls "
                      f"({self.last_error[node]})")
            return Transition(node, "stale", reason)
        if not silent and node in self.stale:
            return Transition(node, "recovered")
        return None

    def commit(self, t: Transition) -> None:
        if t.kind == "stale":
            self.stale.add(t.node)
        else:
            self.stale.discard(t.node)

    def forget(self, node: str) -> None:
        self.misses.pop(node, None)
        self.last_error.pop(node, None)
        self.stale.discard(node)


def _parse_url(url: str) -> tuple[str, int, str]:
    u = urlsplit(url if "://" in url else f"http://{url}")
    if u.scheme != "http" or not u.hostname:
        raise ValueError(f"agent URL must be http://host[:port][/path]: {url!r}")
    path = u.path if u.path.endswith("/v1/stats") else u.path.rstrip("/") + "/v1/stats"
    return u.hostname, u.port or 9464, path


class _TurnedAway(Exception):
    """The agent closed the connection before any answer, or answered 503: it is asked again."""


async def fetch_json(host: str, port: int, path: str, token: str, timeout: float) -> Any:
    """GET ``path`` with a bearer token; the parsed JSON body, or PollError. A poll the agent turns away is
    tried again, with growing pauses, until ``timeout`` (connect and answer of every try together)."""
    pause, tries = 0.05, 0
    try:
        async with asyncio.timeout(timeout):
            while True:
                tries += 1
                try:
                    status, body = await _get(host, port, path, token)
                    break
                except _TurnedAway:
                    await asyncio.sleep(pause)
                    pause = min(2 * pause, 0.5)
    except TimeoutError:
        if tries > 1:
            raise PollError(f"turned away {tries - 1} times (HTTP 503, or closed unanswered)") from None
        raise
    if status == 401:
        raise PollError("HTTP 401 unauthorized (token mismatch)")
    if status != 200:
        raise PollError(f"HTTP {status}")
    try:
        return json.loads(body)
    except ValueError as e:
        raise PollError(f"invalid JSON: {e}") from None


async def _get(host: str, port: int, path: str, token: str) -> tuple[int, bytes]:
    """One GET: (status, body); _TurnedAway for a 503 or a connection closed before any byte of an answer."""
    req = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
           f"Authorization: Bearer {token}\r\nAccept: application/json\r\n"
           f"Connection: close\r\n\r\n").encode()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        try:
            writer.write(req)
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionResetError) as e:
            if isinstance(e, asyncio.IncompleteReadError) and e.partial:
                raise
            raise _TurnedAway() from None
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise PollError(f"bad status line {lines[0][:60]!r}")
        status = int(parts[1])
        if status == 503:
            raise _TurnedAway()
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                k, v = line.split(":", 1)
                headers[k.strip().lower()] = v.strip()
        if "content-length" in headers:
            n = int(headers["content-length"])
            if n > MAX_BODY:
                raise PollError(f"body too large ({n} bytes)")
            body = await reader.readexactly(n)
        else:
            body = await reader.read(MAX_BODY + 1)
            if len(body) > MAX_BODY:
                raise PollError("body too large")
    finally:
        writer.close()
    return status, body


def _describe(e: BaseException) -> str:
    if isinstance(e, TimeoutError):
        return "timeout"
    if isinstance(e, PollError):
        return str(e)
    if isinstance(e, asyncio.IncompleteReadError):
        return "connection closed early"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, OSError):
        return os.strerror(e.errno) if e.errno else str(e) or type(e).__name__
    return f"{type(e).__name__}: {e}"


class Poller:
    """Polls a set of ``(node, url)`` agents; see the module docstring."""

    def __init__(
        self,
        targets: Iterable[tuple[str, str]],
        token: str,
        *,
        timeout: float = 2.0,
        stale_after: int = 3,
        max_concurrency: int = 1024,
        on_stale: Callable[[str, str], Any] | None = None,
        on_recover: Callable[[str], Any] | None = None,
    ) -> None:
        self.token = token
        self.timeout = timeout
        self.max_concurrency = max_concurrency
        self.on_stale = on_stale
        self.on_recover = on_recover
        self.tracker = StaleTracker(stale_after)
        self._targets: dict[str, tuple[str, int, str]] = {}
        self.set_targets(targets)

    def set_targets(self, targets: Iterable[tuple[str, str]]) -> None:
        """Replace the agent list; nodes no longer listed are forgotten."""
        new = {node: _parse_url(url) for node, url in targets}
        for node in set(self._targets) - set(new):
            self.tracker.forget(node)
        self._targets = new

    @property
    def stale_nodes(self) -> set[str]:
        return set(self.tracker.stale)

    def health(self) -> dict[str, str]:
        """Each polled node's agent: ``ok``, ``missed N`` (its last N polls failed), or ``stale`` (silent for
        ``stale_after`` polls; the node itself is as Slurm has it)."""
        out = {}
        for node in self._targets:
            misses = self.tracker.misses.get(node, 0)
            out[node] = "stale" if node in self.tracker.stale else ("ok" if misses == 0 else f"missed {misses}")
        return out

    async def _poll_one(self, sem: asyncio.Semaphore, node: str) -> PollResult:
        host, port, path = self._targets[node]
        async with sem:
            t0 = time.perf_counter()
            try:
                sample = await fetch_json(host, port, path, self.token, self.timeout)
                if not isinstance(sample, dict) or sample.get("schema") != SCHEMA_VERSION:
                    raise PollError("unexpected sample schema")
                if sample.get("node") != node:
                    raise PollError(f"agent reports node {sample.get('node')!r}")
                return PollResult(node, sample, None, time.perf_counter() - t0)
            except Exception as e:
                return PollResult(node, None, _describe(e), time.perf_counter() - t0)

    async def poll_round_async(self) -> PollRound:
        t0 = time.perf_counter()
        sem = asyncio.Semaphore(self.max_concurrency)
        results = await asyncio.gather(*(self._poll_one(sem, n) for n in self._targets))
        wall = time.perf_counter() - t0
        committed, failed = self._apply(results)
        return PollRound(list(results), committed, wall, failed)

    def poll_round(self) -> PollRound:
        """One round, from synchronous code (runs its own event loop)."""
        return asyncio.run(self.poll_round_async())

    def _apply(self, results: Iterable[PollResult]) -> tuple[list[Transition], list[Transition]]:
        committed, failed = [], []
        for r in results:
            t = self.tracker.observe(r.node, r.sample is not None, r.error)
            if t is None:
                continue
            try:
                if t.kind == "stale" and self.on_stale is not None:
                    self.on_stale(t.node, t.reason)
                elif t.kind == "recovered" and self.on_recover is not None:
                    self.on_recover(t.node)
            except Exception:
                log.exception("%s callback failed for node %s; retrying next round", t.kind, t.node)
                failed.append(t)
                continue
            self.tracker.commit(t)
            committed.append(t)
        return committed, failed
