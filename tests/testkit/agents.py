"""Helpers of the agent tests: waiting on a condition, and real `dl2-agent --fake-gpus` processes."""
import os
import re
import socket
import subprocess
import sys
import time


def wait_until(pred, timeout: float = 10.0, step: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return False


TOKEN = "daemon-test-token-77"


def start_agent(token_file, node, *extra):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, "-m", "dl2d.agents.main", "--bind", "127.0.0.1", "--port", str(port),
                          "--token-file", token_file, "--node-name", node, "--fake-gpus", "2", *extra],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONUNBUFFERED="1"))
    line = p.stdout.readline()
    m = re.search(r"listening on (http://\S+)", line)
    assert m, (line, p.stderr.read())
    return p, m.group(1)


def stop_agents(procs):
    for p, _ in procs:
        if p.poll() is None:
            p.terminate()
            p.wait(10)
        p.stdout.close()
        p.stderr.close()
