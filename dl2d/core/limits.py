"""Per-job task limits: one place for the 16 workers / 16 PS of DL2 (the policy's output layer and every
heuristic respect them; a submission may ask for fewer)."""
from __future__ import annotations

MAX_WORKERS = 16
MAX_PS = 16
#: Most workers of an all-reduce job when its submission does not say: the largest measured job (64 GPUs,
#: dl2d/workload/data/pollux); a PS job's default stays DL2's 16.
ALLREDUCE_MAX_WORKERS = 64
