"""Every hyper-parameter of the DL2 policy in one place (defaults: DL2 section 6.2 and the authors' code)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from dl2d.core.limits import MAX_PS, MAX_WORKERS
from dl2d.policy.dl2.job_info import NUM_SPEED_FEATURES
from dl2d.workload.catalog import NUM_CLASSES


#: (field, low, high): integer fields' bounds, checked first
_INT_BOUNDS = (("max_jobs", 1, 4096), ("num_types", 1, 1024), ("max_workers", 1, 64), ("max_ps", 1, 64),
               ("hidden", 1, 8192), ("sl_batch", 1, 1_000_000), ("replay_size", 1, 10_000_000),
               ("minibatch", 1, 1_000_000), ("updates_per_slot", 1, 1000), ("n_step", 1, 1000))
#: (field, low, high, low excluded): float fields' bounds (NaN and infinities never pass)
_FLOAT_BOUNDS = (("sl_lr", 0.0, 10.0, True), ("rl_lr", 0.0, 10.0, True), ("gamma", 0.0, 1.0, False),
                 ("entropy_weight", 0.0, 1e3, False), ("value_weight", 0.0, 1e3, False), ("epsilon", 0.0, 1.0, False),
                 ("poor_ratio", 0.0, 1e6, True), ("slots_scale", 0.0, 1e9, True), ("epochs_scale", 0.0, 1e9, True))
#: the most weights a policy network may have (about 0.5 GB of float32 for the policy and the value network)
MAX_WEIGHTS = 60_000_000


@dataclass(frozen=True)
class PolicyConfig:
    # state / action space
    max_jobs: int = 40  # J: the scheduling window; more concurrent jobs are scheduled in windows of J
    num_types: int = NUM_CLASSES  # L: one-hot over the catalog's classes (DL2's 8 types, 6 all-reduce, 1 unseen)
    # how a job is described: "type" (DL2: its one-hot model type) or "speed" (what its speed estimate says:
    # scaling efficiency, remaining work, all-reduce or not; dl2d.policy.dl2.job_info), which works for any model
    job_encoding: str = "type"
    max_workers: int = MAX_WORKERS
    max_ps: int = MAX_PS
    starting_bundle: bool = True  # give every job one worker + one PS before the network decides (no starvation)
    # networks
    hidden: int = 256
    # supervised warm-up
    sl_lr: float = 0.005
    sl_batch: int = 256
    # online RL
    rl_lr: float = 1e-4
    gamma: float = 0.9
    entropy_weight: float = 0.1
    value_weight: float = 0.5
    epsilon: float = 0.2  # job-aware exploration probability in a poor state
    poor_ratio: float = 10.0  # w/u or u/w above this is a poor state
    # which skew counts as poor: "both" (DL2: w/u or u/w above poor_ratio), "workers" (only w/u: many workers on
    # few PS; one worker with many PS is what Optimus does and is not "fixed"), "none" (only no-PS / no-worker)
    poor_skew: str = "both"
    replay_size: int = 8192
    minibatch: int = 256
    updates_per_slot: int = 1
    n_step: int = 1  # critic target: n-step discounted return of the slot rewards + gamma^n V(state n slots on)
    normalize_advantage: bool = True  # advantages standardised per minibatch
    # "critic": A = n-step return - V(s) (DL2's actor-critic). "greedy": A = this slot's reward - the reward the
    # greedy policy gets from the same slot state and noise in the simulator (a self-critical baseline; needs a
    # simulator, so training only, not DL2's own design)
    advantage: str = "critic"
    # feature scaling
    slots_scale: float = 100.0
    epochs_scale: float = 300.0

    @property
    def job_dim(self) -> int:
        """Columns describing what the job is: its one-hot type, or its speed features."""
        return self.num_types if self.job_encoding == "type" else NUM_SPEED_FEATURES

    @property
    def features_per_job(self) -> int:
        return self.job_dim + 5  # what the job is, d, e, r, w, u

    @property
    def state_dim(self) -> int:
        return self.max_jobs * self.features_per_job

    @property
    def num_actions(self) -> int:
        return 3 * self.max_jobs + 1

    @property
    def max_steps(self) -> int:
        """Upper bound on inferences in one window: each non-void action adds at least one task."""
        return self.max_jobs * (self.max_workers + self.max_ps) + 1

    def __post_init__(self):
        """Every field within bounds, before anything is allocated from it: a config read from a checkpoint
        file is untrusted (a 5 KB file asking for a 20000-wide network must not take 12 GB to refuse)."""
        for name, lo, hi in _INT_BOUNDS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
                raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}")
        for name, lo, hi, lo_open in _FLOAT_BOUNDS:
            v = getattr(self, name)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and \
                (lo < v if lo_open else lo <= v) and v <= hi
            if not ok:
                raise ValueError(f"{name} must be a finite number in {'(' if lo_open else '['}{lo:g}, {hi:g}], "
                                 f"got {v!r}")
        if not isinstance(self.starting_bundle, bool) or not isinstance(self.normalize_advantage, bool):
            raise ValueError("starting_bundle and normalize_advantage must be true or false")
        weights = self.state_dim * self.hidden + self.hidden * (self.hidden + self.num_actions + 1)
        if weights > MAX_WEIGHTS:
            raise ValueError(f"max_jobs {self.max_jobs} x hidden {self.hidden} makes a network of {weights:,} "
                             f"weights, more than the {MAX_WEIGHTS:,} allowed")
        if self.poor_skew not in ("both", "workers", "none"):
            raise ValueError(f"poor_skew must be 'both', 'workers' or 'none', not {self.poor_skew!r}")
        if self.job_encoding not in ("type", "speed"):
            raise ValueError(f"job_encoding must be 'type' or 'speed', not {self.job_encoding!r}")
        if self.advantage not in ("critic", "greedy"):
            raise ValueError(f"advantage must be 'critic' or 'greedy', not {self.advantage!r}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "PolicyConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            # repr: a key read from a file may hold a newline or not be text; the message stays one line
            raise ValueError(f"unknown policy config key(s): {', '.join(sorted(map(repr, unknown)))}")
        return cls(**d)
