"""One user's flood of submissions against the daemon's real control socket (docs/security.md): as root, `nobody`
(setpriv, the system python) submits N jobs as fast as the socket answers them while root asks ``whoami`` every
0.2 s; the [limits] are the daemon's defaults unless given. The slot's cost with the jobs such a flood leaves
waiting is bench/bench_daemon_tick.py's (``--nodes 16 --jobs 3000 --windows 0,256``).

    python bench/bench_submit_flood.py [--n 1000] [--rate 120] [--pending 500] [--max-submit 1000]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "daemon"))
from test_daemon_limits import SUBMITTER  # noqa: E402  (the stdlib-only client the test runs)

from dl2d.daemon.config import LimitsSection  # noqa: E402
from dl2d.daemon.control import ControlServer, ask  # noqa: E402
from dl2d.daemon.quota import Limits  # noqa: E402
from dl2d.db.engine import make_engine, upgrade  # noqa: E402


def flood(n: int, limits: Limits) -> dict:
    d = Path(tempfile.mkdtemp(prefix="dl2d-flood-"))
    d.chmod(0o755)
    engine = make_engine(f"sqlite:///{d / 'dl2d.sqlite'}")
    upgrade(engine)
    sock = str(d / "dl2d.sock")
    server = ControlServer(sock, engine, "dl2d-admin", limits=limits)
    server.start()
    root_ms: list[float] = []
    stop = threading.Event()

    def root() -> None:
        while not stop.wait(0.2):
            t = time.perf_counter()
            assert ask(sock, {"op": "whoami"})["ok"]
            root_ms.append(1000 * (time.perf_counter() - t))

    t = threading.Thread(target=root, daemon=True)
    t.start()
    try:
        python = shutil.which("python3", path="/usr/bin:/bin")
        p = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", python, "-c", SUBMITTER,
                            sock, str(n)], capture_output=True, text=True, timeout=600, cwd="/", env={})
        out = json.loads(p.stdout)
    finally:
        stop.set()
        t.join(timeout=5)
        server.close()
        shutil.rmtree(d, ignore_errors=True)
    return {"submitted": n, "accepted": out["ok"], "seconds": round(out["seconds"], 2),
            "refusals": sorted(out["refusals"]), "root_whoami_ms_median": round(statistics.median(root_ms), 2),
            "root_whoami_ms_max": round(max(root_ms), 2), "root_requests": len(root_ms)}


def main() -> None:
    d = LimitsSection()
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--rate", type=int, default=d.submit_rate)
    ap.add_argument("--pending", type=int, default=d.max_pending_jobs)
    ap.add_argument("--max-submit", type=int, default=d.max_submit_jobs)
    a = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root (the flood runs as nobody)")
    print(json.dumps(flood(a.n, Limits(a.max_submit, a.pending, a.rate))), flush=True)


if __name__ == "__main__":
    main()
