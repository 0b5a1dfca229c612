"""A tiny stand-in training program for the Slurm driver tests (the real elastic runtime is
``dl2-run`` in :mod:`dl2d.elastic`).

    python -m dl2d.slurm.demo_job --epochs N --checkpoint DIR/ckpt.json \\
        --progress DIR/progress.json --seconds-per-epoch 0.5

It "trains" one epoch per ``--seconds-per-epoch`` and after each epoch writes the progress file
atomically (``{"epoch", "epochs", "status", "resumed_from", "runs", "slurm_job_id", "nodes", "time"}``;
``time``: unix seconds of the record, so the daemon knows when the job said it was done).
On SIGUSR1 or SIGTERM it finishes the current step, writes the checkpoint (write-then-rename),
marks the progress ``"checkpointed"`` and exits with status 0 (SIGUSR1) or 143 (SIGTERM).
When started with an existing checkpoint it resumes at the saved epoch. At the end the status
is ``"done"`` and the checkpoint is kept, so a rerun is a no-op.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from dl2d.core.files import write_json_atomic


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dl2d.slurm.demo_job", description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--progress", type=Path, required=True)
    p.add_argument("--seconds-per-epoch", type=float, default=0.5)
    args = p.parse_args(argv)

    stop: list[int] = []
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: stop.append(signum))

    ckpt = read_json(args.checkpoint) or {}
    start_epoch = int(ckpt.get("epoch", 0))
    prev = read_json(args.progress) or {}
    state = {
        "epoch": start_epoch,
        "epochs": args.epochs,
        "status": "running",
        "resumed_from": start_epoch if ckpt else None,
        "runs": int(prev.get("runs", 0)) + 1,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "nodes": os.environ.get("SLURM_JOB_NODELIST"),
        "time": time.time(),
    }
    write_json_atomic(args.progress, state)

    epoch = start_epoch
    step = 0.05  # check for signals this often within an epoch
    while epoch < args.epochs and not stop:
        t_end = time.monotonic() + args.seconds_per_epoch
        while time.monotonic() < t_end and not stop:
            time.sleep(min(step, max(t_end - time.monotonic(), 0)))
        if stop:
            break  # the interrupted epoch is redone after resume
        epoch += 1
        write_json_atomic(args.progress, {**state, "epoch": epoch, "time": time.time()})

    write_json_atomic(args.checkpoint, {"epoch": epoch, "epochs": args.epochs, "time": time.time()})
    if stop and epoch < args.epochs:
        write_json_atomic(args.progress, {**state, "epoch": epoch, "status": "checkpointed", "time": time.time()})
        print(f"demo_job: signal {stop[0]}: checkpointed at epoch {epoch}", flush=True)
        return 0 if stop[0] == signal.SIGUSR1 else 128 + stop[0]
    write_json_atomic(args.progress, {**state, "epoch": epoch, "status": "done", "time": time.time()})
    print(f"demo_job: done, {epoch} epochs (resumed from {state['resumed_from']})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
