"""Entry point of one PS or worker process: ``python -m dl2d.elastic.role ps|worker --coord HOST:PORT``."""

from __future__ import annotations

import argparse
import signal
import socket
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dl2d.elastic.role", description=__doc__)
    ap.add_argument("role", choices=["ps", "worker"])
    ap.add_argument("--coord", required=True, help="coordinator HOST:PORT")
    ap.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 on a cluster)")
    ap.add_argument("--advertise-host", default=None,
                    help="address peers use to reach this role (default: --host, or the hostname for 0.0.0.0)")
    args = ap.parse_args(argv)
    # Slurm/daemon signals go to the launcher, which checkpoints through the coordinator.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    adv = args.advertise_host or (args.host if args.host != "0.0.0.0" else socket.gethostname())
    if args.role == "ps":
        from .ps import ParameterServer
        r = ParameterServer(args.coord, host=args.host, advertise_host=adv).start()
    else:
        from .worker import Worker
        r = Worker(args.coord, host=args.host, advertise_host=adv).start()
    r.exited.wait()
    err = getattr(r, "error", None)
    if err is not None:
        print(f"{args.role} failed: {err!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
