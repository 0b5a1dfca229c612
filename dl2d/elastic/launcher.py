"""dl2-run: launch an elastic DL2 training job (coordinator + PSs + workers).

Typical sbatch script::

    #!/bin/bash
    #SBATCH --nodes=3 --signal=B:USR1@60 --requeue
    exec dl2-run --job-id "$SLURM_JOB_ID" --workers 4 --ps 2 --epochs 10 \\
                 --checkpoint-dir "$HOME/dl2/$SLURM_JOB_ID" --model-size 1M

Inside an allocation (``SLURM_JOB_ID`` set) each role is started with ``srun``
on the allocated nodes (``SLURM_JOB_NODELIST``, round robin); with ``--local``
the roles are local processes.  This process runs the job's coordinator.

Signals: SIGTERM or SIGUSR1 make the job pause at a consistent model version,
write ``<checkpoint-dir>/checkpoint.npz`` atomically and exit with code 75;
running dl2-run again with the same ``--checkpoint-dir`` (any --workers/--ps)
resumes at the same epoch and step.  Exit codes: 0 finished (final model in
``<checkpoint-dir>/model.npz``), 75 checkpointed (relaunch to continue), 1 failed.

Progress (epoch, step, samples/s, workers, PSs) is written to
``--progress-file`` and POSTed as JSON to ``--progress-url`` /
``$DL2D_PROGRESS_URL`` (best effort).  The coordinator address is in
``<checkpoint-dir>/coordinator.json`` for :mod:`dl2d.elastic.control`
(hot scaling and checkpoints driven by the daemon).

Authentication: every connection between the roles, and from the daemon, proves
knowledge of the job's secret: the file named by ``$DL2D_JOB_SECRET_FILE`` (the
daemon writes it; mode 0600 or 0400, else dl2-run exits 1), or, without it, a
secret made on first start in ``<checkpoint-dir>/job.secret`` (0600) and kept.
The PSs and workers get a key derived from it in their environment.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time

from dl2d.core.files import SecretFileError, ensure_secret_file, read_secret_file, write_json_atomic

from .auth import SECRET_FILE_ENV
from .checkpoint import load_checkpoint
from .cluster import ProcessSpawner
from .coordinator import Coordinator
from .guards import DEFAULT_MAX_ROLES
from .model import TrainConfig, parse_size
from .progress import ProgressReporter
from .protocol import node_address

EXIT_DONE, EXIT_FAILED, EXIT_CHECKPOINTED = 0, 1, 75
#: A standalone job's secret, in its checkpoint directory (the daemon names its own in $DL2D_JOB_SECRET_FILE).
SECRET_FILE = "job.secret"


def job_secret(checkpoint_dir: str, environ: dict | None = None) -> tuple[str, str]:
    """``(secret, path)``: the file named by ``$DL2D_JOB_SECRET_FILE``, or ``<checkpoint-dir>/job.secret``
    (made on first use). SecretFileError (one line) for a file that is unreadable, too short or that group or
    others can access."""
    path = (os.environ if environ is None else environ).get(SECRET_FILE_ENV)
    if path:
        return read_secret_file(path, what="job secret file"), path
    path = os.path.join(checkpoint_dir, SECRET_FILE)
    return ensure_secret_file(path, what="job secret file"), path


def slurm_nodes() -> list[str]:
    nl = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST")
    if not nl:
        return []
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nl], capture_output=True, text=True,
                             check=True, timeout=30).stdout
        return [x for x in out.split() if x]
    except (OSError, subprocess.SubprocessError):
        return [nl] if "[" not in nl and "," not in nl else nl.replace("[", ",").replace("]", "").split(",")[:1]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dl2-run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job-id", default=os.environ.get("SLURM_JOB_ID", "local"),
                    help="job id used in progress reports (default: $SLURM_JOB_ID or 'local')")
    ap.add_argument("--workers", type=int, default=1, help="initial number of workers (>= 1)")
    ap.add_argument("--ps", type=int, default=1, help="initial number of parameter servers (>= 1)")
    ap.add_argument("--epochs", type=int, default=1, help="training epochs over the synthetic data set")
    ap.add_argument("--checkpoint-dir", required=True,
                    help="directory for checkpoint.npz, model.npz, progress.json and coordinator.json; "
                         "an existing checkpoint there is resumed")
    ap.add_argument("--model-size", default="10k",
                    help="approximate number of float32 parameters of the MLP, e.g. 10k, 1M, 25M")
    ap.add_argument("--samples", type=int, default=2048, help="synthetic data set size")
    ap.add_argument("--global-batch", type=int, default=64,
                    help="global batch per step (synchronous: split over the workers; async: per worker)")
    ap.add_argument("--lr", type=float, default=0.01, help="SGD learning rate")
    ap.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    ap.add_argument("--seed", type=int, default=0, help="seed of data, data order and init")
    ap.add_argument("--async", dest="async_", action="store_true",
                    help="asynchronous training (default: synchronous)")
    ap.add_argument("--local", action="store_true",
                    help="start roles as local processes instead of srun (outside Slurm)")
    ap.add_argument("--port", type=int, default=0, help="coordinator TCP port (0 = any)")
    ap.add_argument("--bind", choices=["auto", "all"], default="auto",
                    help="inside Slurm, what the roles listen on: auto = the address the node's hostname "
                         "resolves to (0.0.0.0 where that is a loopback address), all = 0.0.0.0 "
                         "(every connection is authenticated either way)")
    ap.add_argument("--max-workers", type=int, default=DEFAULT_MAX_ROLES,
                    help="most workers a SCALE may ask for (default %(default)s; never fewer than --workers)")
    ap.add_argument("--max-ps", type=int, default=DEFAULT_MAX_ROLES,
                    help="most PSs a SCALE may ask for (default %(default)s, and at most one per parameter block)")
    ap.add_argument("--progress-url", default=os.environ.get("DL2D_PROGRESS_URL"),
                    help="daemon URL to POST progress JSON to (default $DL2D_PROGRESS_URL)")
    ap.add_argument("--progress-file", default=None,
                    help="local progress JSON file (default <checkpoint-dir>/progress.json)")
    ap.add_argument("--progress-interval", type=float, default=1.0, help="seconds between reports")
    ap.add_argument("--role-threads", type=int, default=1,
                    help="BLAS/OpenMP threads per PS/worker process unless OMP_NUM_THREADS etc. are set "
                         "(0: leave the environment alone)")
    ap.add_argument("--log-dir", default=None, help="directory for per-role logs (default: inherit stdout)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines on stdout")
    ap.add_argument("rest", nargs="*", help="arguments after '--' are reserved and ignored")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ck = load_checkpoint(args.checkpoint_dir)
    if ck is not None:
        cfg = TrainConfig.from_dict(ck[0]["config"])
        cfg.epochs = args.epochs
    else:
        cfg = TrainConfig.for_model_size(parse_size(args.model_size), n_samples=args.samples,
                                         global_batch=args.global_batch, lr=args.lr,
                                         momentum=args.momentum, epochs=args.epochs, seed=args.seed,
                                         sync=not args.async_)
    in_slurm = bool(os.environ.get("SLURM_JOB_ID")) and not args.local
    if not args.local and not in_slurm:
        print("dl2-run: not inside a Slurm allocation; use --local", file=sys.stderr)
        return EXIT_FAILED
    if in_slurm:
        host, role_host = (node_address(), "auto") if args.bind == "auto" else ("0.0.0.0", "0.0.0.0")
    else:
        host = role_host = "127.0.0.1"
    adv = socket.gethostname() if in_slurm else "127.0.0.1"
    os.makedirs(args.checkpoint_dir, exist_ok=True)
    try:
        secret, secret_file = job_secret(args.checkpoint_dir)
    except SecretFileError as e:
        print(f"dl2-run: {e}", file=sys.stderr)
        return EXIT_FAILED
    progress = ProgressReporter(args.progress_url,
                                args.progress_file or os.path.join(args.checkpoint_dir, "progress.json"),
                                interval=args.progress_interval)
    spawner = ProcessSpawner(nodes=slurm_nodes() if in_slurm else None, srun=in_slurm,
                             bind_host=role_host, log_dir=args.log_dir, threads=args.role_threads or None)
    coord = Coordinator(cfg, args.ps, args.workers, job_id=args.job_id, host=host, port=args.port,
                        advertise_host=adv, spawner=spawner, checkpoint_dir=args.checkpoint_dir,
                        progress=progress, secret=secret, max_workers=args.max_workers,
                        max_ps=args.max_ps).start()
    spawner.coord_addr = coord.address
    spawner.member_key = coord.member_key
    # the secret's file, not the secret: for a local operator's dl2d.elastic.control (the daemon never reads it)
    write_json_atomic(os.path.join(args.checkpoint_dir, "coordinator.json"),
                      {"address": coord.address, "job_id": args.job_id, "pid": os.getpid(),
                       "secret_file": os.path.abspath(secret_file)}, fsync=False)
    signalled: list[int] = []
    for s in (signal.SIGTERM, signal.SIGUSR1):
        signal.signal(s, lambda n, f: signalled.append(n))
    if not args.quiet:
        print(f"dl2-run: job {args.job_id} coordinator {coord.address} params={cfg.n_params} "
              f"steps={cfg.total_steps} start_step={coord.start_version}", flush=True)
    spawner.spawn("ps", args.ps)
    spawner.spawn("worker", args.workers)
    code = EXIT_FAILED
    last = 0.0
    try:
        while True:
            if coord.finished.wait(0.2):
                code = EXIT_DONE if coord.exit_reason == "done" else (
                    EXIT_CHECKPOINTED if coord.exit_reason == "checkpointed" else EXIT_FAILED)
                break
            if signalled:
                if not args.quiet:
                    print(f"dl2-run: signal {signalled[0]}: checkpointing", flush=True)
                try:
                    r = coord.request("checkpoint", True, timeout=600)
                    if not args.quiet:
                        print(f"dl2-run: checkpoint at step {r['version']} -> {r['path']}", flush=True)
                    code = EXIT_CHECKPOINTED
                except Exception as e:
                    print(f"dl2-run: checkpoint failed: {e}", file=sys.stderr)
                    code = EXIT_FAILED
                break
            if not args.quiet and time.monotonic() - last > 5:
                last = time.monotonic()
                spe = cfg.steps_per_epoch
                print(f"dl2-run: epoch {coord.version // spe} step {coord.version}/{cfg.total_steps} "
                      f"{coord.samples_per_s:.0f} samples/s workers={len(coord.workers)} ps={len(coord.ps)}",
                      flush=True)
    finally:
        if coord.errors:
            print("dl2-run: errors: " + "; ".join(coord.errors), file=sys.stderr)
        spawner.kill_all()
        coord.close()
    if not args.quiet:
        print(f"dl2-run: exit {code} ({coord.exit_reason})", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
