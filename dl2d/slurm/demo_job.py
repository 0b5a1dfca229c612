"""A tiny stand-in training program for the Slurm driver tests (the real elastic runtime is
``dl2-run`` in :mod:`dl2d.elastic`).

    python -m dl2d.slurm.demo_job --epochs N --checkpoint DIR/ckpt.json \\
        --progress DIR/progress.json --seconds-per-epoch 0.5
    python -m dl2d.slurm.demo_job --epochs 0.8 ... --speed 1:0.05,2:0.09,4:0.16

It "trains" one epoch per ``--seconds-per-epoch`` and after each epoch writes the progress file
atomically (``{"epoch", "epochs", "status", "resumed_from", "runs", "slurm_job_id", "nodes", "time"}``;
``time``: unix seconds of the record, so the daemon knows when the job said it was done).

With ``--speed`` it trains at a declared speed curve instead: epochs per second by its number of workers
(``$DL2D_WORKERS``, what dl2d sized it to, or the target file's when dl2d shrinks it in place; a size the
curve does not name trains at the nearest smaller one's speed), and its progress is fractional, written every ``--report-s``: a twin given the same curve (the
conformance harness, dl2d.daemon.conform) trains it exactly as fast, and a checkpoint keeps the fraction.
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


def parse_speed(text: str) -> dict[int, float]:
    """``"1:0.05,2:0.09"`` -> {1: 0.05, 2: 0.09} (workers: epochs per second, each > 0)."""
    curve = {}
    for item in text.split(","):
        w, _, rate = item.partition(":")
        workers, epochs_per_s = int(w), float(rate)
        if workers < 1 or not 0 < epochs_per_s < float("inf"):
            raise ValueError(f"bad speed {item!r}: workers >= 1 and epochs per second > 0")
        curve[workers] = epochs_per_s
    if not curve:
        raise ValueError("an empty speed curve")
    return curve


def speed_at(curve: dict[int, float], workers: int) -> float:
    """Epochs per second at ``workers``: the curve's, or that of its nearest smaller size (the smallest's below it)."""
    known = [w for w in curve if w <= workers]
    return curve[max(known)] if known else curve[min(curve)]


def target_workers(path: str | None, default: int) -> int:
    """The workers of the job's target file (``$DL2D_TARGET_FILE``: dl2d rewrites it when it shrinks the job in
    place), or ``default`` where it names none."""
    try:
        workers = int(json.loads(Path(path).read_text())["workers"]) if path else default
    except (OSError, ValueError, KeyError, TypeError):
        return default
    return workers if workers >= 1 else default


def train_by_curve(epoch: float, epochs: float, rate, report_s: float, stop: list[int], report) -> float:
    """Train from ``epoch`` to ``epochs`` at ``rate()`` epochs/s (asked again at every report), reporting every
    ``report_s``, until done or a signal (in ``stop``); returns the epoch reached (fractional: what was trained
    until the signal)."""
    speed, t_last = rate(), time.monotonic()
    next_report = t_last + report_s
    while epoch < epochs and not stop:
        time.sleep(min(0.02, max(next_report - time.monotonic(), 0.0)))
        now = time.monotonic()
        epoch, t_last = min(epoch + speed * (now - t_last), epochs), now
        if now >= next_report or epoch >= epochs:
            report(epoch)
            next_report = now + report_s
            speed = rate()
    return epoch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dl2d.slurm.demo_job", description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=float, required=True)
    p.add_argument("--checkpoint", type=Path, required=True)
    p.add_argument("--progress", type=Path, required=True)
    p.add_argument("--seconds-per-epoch", type=float, default=0.5)
    p.add_argument("--speed", type=parse_speed, help="W:EPOCHS_PER_S,... by workers ($DL2D_WORKERS)")
    p.add_argument("--report-s", type=float, default=0.2, help="with --speed: seconds between progress records")
    args = p.parse_args(argv)

    stop: list[int] = []
    for sig in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: stop.append(signum))

    ckpt = read_json(args.checkpoint) or {}
    start_epoch = float(ckpt.get("epoch", 0)) if args.speed else int(ckpt.get("epoch", 0))
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
    if args.speed:
        workers = int(os.environ.get("DL2D_WORKERS") or 1)
        target = os.environ.get("DL2D_TARGET_FILE")
        epoch = train_by_curve(epoch, args.epochs, lambda: speed_at(args.speed, target_workers(target, workers)),
                               args.report_s, stop,
                               lambda e: write_json_atomic(args.progress, {**state, "epoch": e, "time": time.time()}))
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
        print(f"demo_job: signal {stop[0]}: checkpointed at epoch {epoch:g}", flush=True)
        return 0 if stop[0] == signal.SIGUSR1 else 128 + stop[0]
    write_json_atomic(args.progress, {**state, "epoch": epoch, "status": "done", "time": time.time()})
    print(f"demo_job: done, {epoch:g} epochs (resumed from {state['resumed_from']})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
