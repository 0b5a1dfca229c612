"""Entry point of one PS or worker process: ``python -m dl2d.elastic.role ps|worker --coord HOST:PORT``.

The job's member key comes in ``$DL2D_ELASTIC_MEMBER_KEY`` (set by dl2-run's spawner; removed from this
process's environment once read), never on the command line."""

from __future__ import annotations

import argparse
import signal
import socket
import sys

from .auth import member_key_from_env
from .protocol import node_address


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dl2d.elastic.role", description=__doc__)
    ap.add_argument("role", choices=["ps", "worker"])
    ap.add_argument("--coord", required=True, help="coordinator HOST:PORT")
    ap.add_argument("--host", default="127.0.0.1",
                    help="address to bind: 'auto' on a cluster (the address this node's hostname resolves to, "
                         "or 0.0.0.0 where that is a loopback address), 0.0.0.0 for all")
    ap.add_argument("--advertise-host", default=None,
                    help="address peers use to reach this role (default: --host, or the hostname for "
                         "auto/0.0.0.0)")
    args = ap.parse_args(argv)
    try:
        key = member_key_from_env()
    except ValueError as e:
        print(f"dl2d.elastic.role: {e}", file=sys.stderr)
        return 1
    # Slurm/daemon signals go to the launcher, which checkpoints through the coordinator.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    host = node_address() if args.host == "auto" else args.host
    adv = args.advertise_host or (args.host if args.host not in ("0.0.0.0", "auto") else socket.gethostname())
    if args.role == "ps":
        from .ps import ParameterServer
        r = ParameterServer(args.coord, key, host=host, advertise_host=adv).start()
    else:
        from .worker import Worker
        r = Worker(args.coord, key, host=host, advertise_host=adv).start()
    r.exited.wait()
    err = getattr(r, "error", None)
    if err is not None:
        print(f"{args.role} failed: {err!r}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
