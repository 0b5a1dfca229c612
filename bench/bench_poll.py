"""Benchmark: one poll round of dl2d's Poller over N simulated node agents.

The agents run in a separate process (so their CPU is not the poller's, but
they share the same cores), each on its own loopback TCP port, and serve a
realistic 8-GPU sample (built by the real sampler over ``FakeNVML``), with
bearer-token check. Two kinds of simulated agent:

* ``asyncio``   - N ``asyncio.start_server`` listeners in one event loop,
                  answering with the pre-serialised sample (cheap servers:
                  measures the poller).
* ``threading`` - N real ``dl2d.agents.server`` ThreadingHTTPServer agents
                  (one serve thread each, one thread per request): the exact
                  HTTP/auth code a node runs, but serving the pre-serialised
                  sample, because N samplers reading psutil on the same two
                  cores would measure the simulation, not the poller (on a
                  real cluster each agent has its own node).

Usage: python bench/bench_poll.py [--agents 1000] [--rounds 7] [--mode asyncio|threading|both]

The ``threading`` variant puts N GIL-bound server threads (plus one thread
per request) on the same cores as the poller; on a 2-core machine it measures
the simulation more than the poller, so use it with a few hundred agents.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import os
import statistics
import subprocess
import sys
import threading
import time

TOKEN = "bench-token-0123456789abcdef"


def _sampler(node: str):
    from dl2d.agents.host import HostReader
    from dl2d.agents.nvml import FakeNVML, FakeProcess, GPUReader
    from dl2d.agents.sample import Sampler

    nv = FakeNVML.h100s(8)
    for i, g in enumerate(nv.gpus):
        g.util_gpu, g.mem_used = 87, 61 * 1024**3
        g.processes = [FakeProcess(pid=10_000 + i, usedGpuMemory=60 * 1024**3)]
    return Sampler(node, GPUReader(nv, job_of_pid=lambda pid: str(pid // 10)), HostReader())


def serve_asyncio(n: int) -> None:
    proto = _sampler("x").sample()

    async def run() -> None:
        ports = []
        for i in range(n):
            node = f"node{i:04d}"
            payload = json.dumps({**proto, "node": node}, separators=(",", ":")).encode()

            async def handle(reader, writer, payload=payload):
                try:
                    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
                    auth = ""
                    for line in head.split("\r\n"):
                        if line.lower().startswith("authorization:"):
                            auth = line.split(":", 1)[1].strip()
                    ok = hmac.compare_digest(auth.encode(), f"Bearer {TOKEN}".encode())
                    data, code = (payload, "200 OK") if ok else (b"{}", "401 Unauthorized")
                    writer.write(f"HTTP/1.1 {code}\r\nContent-Type: application/json\r\n"
                                 f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n".encode()
                                 + data)
                    await writer.drain()
                finally:
                    writer.close()

            srv = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=128)
            ports.append(srv.sockets[0].getsockname()[1])
        print(json.dumps(ports), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)

    asyncio.run(run())


def serve_threading(n: int) -> None:
    from dl2d.agents.server import make_server

    proto = _sampler("x").sample()
    ports = []
    for i in range(n):
        payload = json.dumps({**proto, "node": f"node{i:04d}"}, separators=(",", ":")).encode()
        srv = make_server("127.0.0.1", 0, TOKEN, lambda payload=payload: payload)
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 5}, daemon=True).start()
        ports.append(srv.server_address[1])
    print(json.dumps(ports), flush=True)
    sys.stdin.read()


def bench(mode: str, n: int, rounds: int) -> dict:
    from dl2d.daemon.poller import Poller

    child = subprocess.Popen([sys.executable, __file__, "--serve", mode, "--agents", str(n)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        ports = json.loads(child.stdout.readline())
        targets = [(f"node{i:04d}", f"http://127.0.0.1:{p}") for i, p in enumerate(ports)]
        poller = Poller(targets, TOKEN, timeout=5.0, stale_after=3)
        poller.poll_round()  # warm-up (imports, first NVML-cache fill in the agents)
        walls, cpus, fails = [], [], 0
        for _ in range(rounds):
            c0 = time.process_time()
            r = poller.poll_round()
            cpus.append(time.process_time() - c0)
            walls.append(r.wall_s)
            fails += len(r.errors)
            time.sleep(0.2)
        size = len(json.dumps(r.results[0].sample))
        return {"mode": mode, "agents": n, "rounds": rounds, "median_s": statistics.median(walls),
                "min_s": min(walls), "max_s": max(walls), "poller_cpu_median_s": statistics.median(cpus),
                "failed_requests": fails,
                "sample_bytes": size}
    finally:
        child.stdin.close()
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--mode", default="asyncio", choices=["asyncio", "threading", "both"])
    ap.add_argument("--serve", choices=["asyncio", "threading"], help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        (serve_asyncio if a.serve == "asyncio" else serve_threading)(a.agents)
        return
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    for mode in (["asyncio", "threading"] if a.mode == "both" else [a.mode]):
        print(json.dumps(bench(mode, a.agents, a.rounds)))


if __name__ == "__main__":
    main()
