"""Fixtures for the node-agent tests: token files and real agent processes."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest

TOKEN = "test-token-5f1c0e"


@pytest.fixture
def token():
    return TOKEN


@pytest.fixture
def token_file(tmp_path):
    p = tmp_path / "agent.token"
    p.write_text(TOKEN + "\n")
    p.chmod(0o600)
    return str(p)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AgentProcess:
    """A real ``dl2-agent`` subprocess (``python -m dl2d.agents.main``)."""

    def __init__(self, token_file: str, node: str, port: int, extra: tuple[str, ...] = ()):
        self.args = [sys.executable, "-m", "dl2d.agents.main", "--bind", "127.0.0.1",
                     "--port", str(port), "--token-file", token_file, "--node-name", node, *extra]
        self.port = port
        self.proc: subprocess.Popen | None = None

    def start(self) -> "AgentProcess":
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env)
        line = self.proc.stdout.readline()  # "dl2-agent: node X listening on http://h:p"
        m = re.search(r"listening on (http://\S+)", line)
        if not m:
            err = self.proc.stderr.read()
            raise RuntimeError(f"agent did not start: {line!r} {err!r}")
        self.url = m.group(1)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            self.proc.stdout.close()
            self.proc.stderr.close()


@pytest.fixture
def agent_factory():
    started: list[AgentProcess] = []

    def make(token_file: str, node: str = "n1", port: int | None = None, extra=()):
        a = AgentProcess(token_file, node, port or free_port(), tuple(extra)).start()
        started.append(a)
        return a

    yield make
    for a in started:
        a.stop()
