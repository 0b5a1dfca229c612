"""Per-job task limits: one place for the 16 workers / 16 PS of DL2 (the policy's output layer and every
heuristic respect them; a submission may ask for fewer)."""
from __future__ import annotations

MAX_WORKERS = 16
MAX_PS = 16
