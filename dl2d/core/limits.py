"""Per-job task limits: one place for the 16 workers / 16 PS of DL2 (the policy's output layer and every
heuristic respect them; a submission may ask for fewer)."""
from __future__ import annotations

from dataclasses import dataclass

MAX_WORKERS = 16
MAX_PS = 16


@dataclass(frozen=True)
class TaskLimits:
    """The most workers and PS one job may have."""

    max_workers: int = MAX_WORKERS
    max_ps: int = MAX_PS

    def __post_init__(self):
        if self.max_workers < 1 or self.max_ps < 0:
            raise ValueError(f"task limits need max_workers >= 1 and max_ps >= 0, "
                             f"got {self.max_workers} / {self.max_ps}")

    def clamp(self, workers: int, ps: int) -> tuple[int, int]:
        """(workers, ps) cut down to these limits."""
        return min(int(workers), self.max_workers), min(int(ps), self.max_ps)
