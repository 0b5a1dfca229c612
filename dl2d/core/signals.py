"""The checkpoint signal of the job contract (docs/jobs.md): one rule for the daemon, which sends it and names
it to sbatch, and the job, which catches it. Standard library only: a training script imports it."""
from __future__ import annotations

import signal


def checkpoint_signal(raw: str) -> signal.Signals:
    """The signal a job is asked to checkpoint with (``[slurm] checkpoint_signal``, ``$DL2D_CHECKPOINT_SIGNAL``):
    ``USR1``, ``SIGUSR1`` or ``10``, as sbatch's ``--signal`` takes it. ValueError (one line) for a name or
    number this system has no signal of, and for KILL and STOP, which a job cannot catch to save. Pure."""
    text = str(raw).strip().upper()
    try:
        sig = signal.Signals(int(text)) if text.isdigit() else signal.Signals[
            text if text.startswith("SIG") else f"SIG{text}"]
    except (KeyError, ValueError):
        raise ValueError(f"{raw!r} is not a signal name or number (e.g. USR1, SIGUSR2, 10)") from None
    if sig in (signal.SIGKILL, signal.SIGSTOP):
        raise ValueError(f"{raw!r} cannot be caught by a job, which must save its checkpoint on it (use USR1)")
    return sig
