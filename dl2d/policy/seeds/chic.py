"""Chic and Chic-Pair (Gong, Li, Liang, Zhan, IWQoS 2019) as schedulers of the slotted simulator.

The paper, mapped onto `dl2d.sim`:

- State (sec. 4.2): for each of the first I jobs by arrival, its model (one-hot over dl2d.workload.catalog's
  classes: DL2's eight types, the six all-reduce models, one for a model never seen), remaining
  iterations (here: remaining epochs / MAX_EPOCHS), workers and PS allocated so far in this decision phase
  (/ max_workers, / max_ps); plus the backlog N_t (jobs beyond the first I; fed as log1p(N_t)). Empty rows
  are all zero. Chic-Pair drops the PS column (it always equals the workers).
- Actions: Chic: 2I+1 (0-based: 2i = one more worker for job i, 2i+1 = one more PS, 2I = void);
  Chic-Pair: I+1 (i = one worker and one PS for job i, I = void).
- Decision phase: from zero tasks, one action per step until the void action, or Condition (1) (nothing more
  fits: here no add action is valid) or Condition (2) (no job's per-iteration time would drop by one more
  worker or PS, judged on the scheduler's speed model; a job with no worker or no PS can always improve).
  Jobs beyond the first I get nothing (they wait, as in the paper).
- Re-scheduling: only when the set of the first I jobs changes (a job of them finished, or a job arrived while
  fewer than I were in the system). Between those events the previous schedule is kept, slot after slot.
- Reward: r_t1 = minus the time all jobs spend in the system, in units of 20 min = one simulator slot, so an
  episode's sum of r_t1 is minus the total JCT in slots; r_t2 = -p1 for an action on a non-existent job;
  r_t3 = -p2 when a job gets its first task, +p2 back once it has both kinds (Chic only).
- Training (Algorithm 1, eq. 9): per iteration, N episodes sampled from the current policy on randomly chosen
  training traces, plus one episode with uniformly random actions; elite threshold xi_k = R_(floor((1-rho)N))
  of the sorted returns; theta_hat = argmax of the log-likelihood of the elite episodes' actions (Adam from the
  current parameters; dropout 0.5 on the first hidden layer while fitting); smoothed update
  theta_k = alpha theta_hat + (1 - alpha) theta_{k-1}; a validation set picks the best policy.

All-reduce jobs have no PS: their PS actions are masked (Chic-Pair's pair is one worker), they train with
workers alone, Condition (2) reads their speed estimate over workers, and r_t3 never applies to them.

Deviations: the void action is masked while no job of the first I has both a worker and a PS and a task still
fits (a policy that allocates nothing would never be re-asked: the set of the first I jobs would not change).
Flags: invalid actions (a non-existent job, a task that fits nowhere, a job at its task limit)
are masked out by default (`mask_invalid=True`), so r_t2 never fires; with `mask_invalid=False` they are
no-ops punished by p1, as in the paper. The paper maximises the sum of probabilities of elite actions in
eq. (3)/(9); we maximise the log-likelihood (the cross-entropy method's usual form). The paper reuses alpha
for Adam's learning rate (0.01); the smoothing alpha is ours (default 0.8).

Also here: a parameter-space Gaussian cross-entropy method (`gaussian_cem_update`), not in the paper, kept as
an alternative optimiser (`method="gaussian"`).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.core.files import InputFileError, NpzArchive, NpzError, atomic_open, read_bounded
from dl2d.core.limits import MAX_PS, MAX_WORKERS
from dl2d.policy.baselines.heuristics import AllocationBuilder
from dl2d.policy.registry import PolicyOptions
from dl2d.workload.catalog import NUM_CLASSES
from dl2d.workload.jobtypes import MAX_EPOCHS
from dl2d.workload.speed import speed_table

NUM_TYPES = NUM_CLASSES  # the catalog's models and one class for a model never seen
GREEDY, SAMPLE, UNIFORM = "greedy", "sample", "uniform"


# ---------------------------------------------------------------- configuration

@dataclass(frozen=True)
class ChicConfig:
    pair: bool = False  # Chic-Pair
    num_jobs: int = 3  # I, the first I jobs scheduled (paper default 3 on a 10-GPU cluster)
    hidden: tuple[int, ...] = (64, 32, 4)  # the paper's network
    dropout: float = 0.5  # on the first hidden layer while fitting
    max_workers: int = MAX_WORKERS
    max_ps: int = MAX_PS
    speed_model: str = "parametric"  # what Condition (2) believes (Optimus's fitted model by default)
    mask_invalid: bool = True
    p1: float = 5.0
    p2: float = 1.0
    # cross-entropy method
    episodes: int = 35  # N
    rho: float = 0.3  # elite fraction: xi_k = R_(floor((1 - rho) N))
    alpha: float = 0.8  # smoothing
    lr: float = 0.01  # Adam
    fit_steps: int = 50  # Adam steps per iteration on the elite samples
    fit_batch: int = 512
    uniform_episode: bool = True  # the paper's extra x_{N+1}
    common_trace: bool = False  # all episodes of an iteration on one trace (the paper: a random trace each)
    method: str = "trajectory"  # trajectory (the paper) | gaussian (parameter-space CEM)
    sigma0: float = 0.1  # gaussian: initial std
    noise_floor: float = 0.01  # gaussian: std never below this

    def __post_init__(self):
        if not 1 <= self.num_jobs <= 4096:  # bounds first: a config read from a file is untrusted
            raise ValueError(f"num_jobs (I) must be in [1, 4096], got {self.num_jobs}")
        if not self.hidden or len(self.hidden) > 16 or min(self.hidden) < 1 or max(self.hidden) > 8192:
            raise ValueError(f"hidden must list 1-16 layer widths in [1, 8192], got {self.hidden}")
        if not 0 <= self.dropout < 1:
            raise ValueError("dropout must be in [0, 1)")
        if not 0 < self.rho <= 1:
            raise ValueError("rho must be in (0, 1]")
        if not 0 < self.alpha <= 1:
            raise ValueError("alpha must be in (0, 1]")
        if self.episodes < 1:
            raise ValueError("episodes (N) must be >= 1")
        if self.method not in ("trajectory", "gaussian"):
            raise ValueError(f"method must be trajectory or gaussian, not {self.method!r}")
        if self.max_workers < 1 or self.max_ps < 1:
            raise ValueError("max_workers and max_ps must be >= 1")

    @property
    def name(self) -> str:
        return "chic-pair" if self.pair else "chic"

    @property
    def row_dim(self) -> int:
        return NUM_TYPES + (2 if self.pair else 3)

    @property
    def state_dim(self) -> int:
        return self.num_jobs * self.row_dim + 1

    @property
    def num_actions(self) -> int:
        return (1 if self.pair else 2) * self.num_jobs + 1

    @property
    def void(self) -> int:
        return self.num_actions - 1

    def to_dict(self) -> dict:
        d = asdict(self)
        d["hidden"] = list(self.hidden)
        return d

    @staticmethod
    def from_dict(d: dict) -> "ChicConfig":
        known = {f.name for f in fields(ChicConfig)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown config field(s) {sorted(unknown)}")
        d = dict(d)
        if "hidden" in d:
            d["hidden"] = tuple(int(h) for h in d["hidden"])
        return ChicConfig(**d)


# ---------------------------------------------------------------- state, actions, reward (pure)

def encode_state(cfg: ChicConfig, type_idx, remaining_epochs, workers, ps, backlog: int) -> np.ndarray:
    """The paper's s_t for up to I jobs (rows beyond the given jobs are zero) and the backlog N_t."""
    n = len(type_idx)
    if n > cfg.num_jobs:
        raise ValueError(f"{n} jobs given, the state holds I = {cfg.num_jobs}")
    rows = np.zeros((cfg.num_jobs, cfg.row_dim))
    if n:
        rows[np.arange(n), np.asarray(type_idx, int)] = 1.0
        rows[:n, NUM_TYPES] = np.asarray(remaining_epochs, float) / MAX_EPOCHS
        rows[:n, NUM_TYPES + 1] = np.asarray(workers, float) / cfg.max_workers
        if not cfg.pair:
            rows[:n, NUM_TYPES + 2] = np.asarray(ps, float) / cfg.max_ps
    return np.concatenate([rows.ravel(), [math.log1p(max(int(backlog), 0))]])


def decode_action(cfg: ChicConfig, a: int) -> tuple[int, str] | None:
    """(job row, 'worker' | 'ps' | 'bundle') of an action, or None for the void action."""
    if not 0 <= a < cfg.num_actions:
        raise ValueError(f"action {a} outside [0, {cfg.num_actions})")
    if a == cfg.void:
        return None
    if cfg.pair:
        return a, "bundle"
    return a // 2, ("worker" if a % 2 == 0 else "ps")


def can_improve(speed: np.ndarray, w: int, p: int, pair: bool, max_w: int, max_p: int,
                allreduce: bool = False) -> bool:
    """Negation of Condition (2) for one job whose speed by (PS, workers) is ``speed``: one more worker or PS
    (a pair for Chic-Pair) would raise its speed (= lower its per-iteration time). A job lacking a worker or a
    PS can always improve; an all-reduce job has only workers."""
    n_p, n_w = speed.shape[0] - 1, speed.shape[1] - 1
    s = lambda pp, ww: speed[min(pp, n_p), min(ww, n_w)]  # noqa: E731
    if allreduce:
        return w < max_w and (w == 0 or s(0, w + 1) > s(0, w))
    if w == 0 or p == 0:
        return (w < max_w) and (p < max_p) if pair else True
    now = s(p, w)
    if pair:
        return w < max_w and p < max_p and s(p + 1, w + 1) > now
    return (w < max_w and s(p, w + 1) > now) or (p < max_p and s(p + 1, w) > now)


def r3_change(w_before: int, p_before: int, w_after: int, p_after: int, p2: float, allreduce: bool = False) -> float:
    """r_t3: -p2 when a job gets its first task, +p2 when it then has both a worker and a PS (never for an
    all-reduce job: its first worker is all it needs)."""
    if allreduce:
        return 0.0
    r = 0.0
    if w_before + p_before == 0 and w_after + p_after > 0:
        r -= p2
    if (w_before == 0 or p_before == 0) and w_after > 0 and p_after > 0:
        r += p2
    return r


def time_in_system(arrival_slot, finish_time, slot: int) -> float:
    """-r_t1 of one slot: the time (in slots, the paper's 20-min unit) jobs spend in the system during slot
    [slot, slot+1), counting a job that finishes inside the slot by its fraction. Its sum over a run is the
    total JCT, so an episode's sum of r_t1 is -sum(JCT)."""
    arr = np.asarray(arrival_slot, float)
    fin = np.asarray(finish_time, float)
    start = np.maximum(arr, slot)
    end = np.minimum(fin, slot + 1)
    return float(np.sum(np.clip(end - start, 0.0, None)))


# ---------------------------------------------------------------- the policy network (numpy forward, JAX fit)

def init_params(cfg: ChicConfig, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    dims = (cfg.state_dim, *cfg.hidden, cfg.num_actions)
    p = {}
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        p[f"w{i}"] = rng.normal(0.0, math.sqrt(2.0 / a), (a, b)) * (0.1 if i == len(dims) - 2 else 1.0)
        p[f"b{i}"] = np.zeros(b)
    return p


def num_layers(params: dict) -> int:
    return sum(1 for k in params if k.startswith("w"))


def logits(params: dict, x: np.ndarray) -> np.ndarray:
    h = np.asarray(x, float)
    n = num_layers(params)
    for i in range(n):
        h = h @ params[f"w{i}"] + params[f"b{i}"]
        if i < n - 1:
            h = np.maximum(h, 0.0)
    return h


def masked_probs(z: np.ndarray, mask: np.ndarray) -> np.ndarray:
    z = np.where(mask, z, -np.inf)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def flatten(params: dict) -> np.ndarray:
    return np.concatenate([np.ravel(params[k]) for k in sorted(params)])


def unflatten(vec: np.ndarray, template: dict) -> dict:
    out, i = {}, 0
    for k in sorted(template):
        n = np.size(template[k])
        out[k] = np.asarray(vec[i:i + n], float).reshape(np.shape(template[k]))
        i += n
    return out




# ---------------------------------------------------------------- the scheduler

@dataclass
class Trajectory:
    states: list = field(default_factory=list)
    masks: list = field(default_factory=list)
    actions: list = field(default_factory=list)
    penalty: float = 0.0  # sum of r_t2 and r_t3
    decisions: int = 0  # decision phases

    def arrays(self, cfg: ChicConfig):
        if not self.actions:
            return np.zeros((0, cfg.state_dim)), np.zeros((0, cfg.num_actions), bool), np.zeros(0, int)
        return np.array(self.states), np.array(self.masks), np.array(self.actions, int)


class ChicScheduler:
    """Chic / Chic-Pair as a simulator scheduler: `sched(view) -> Allocation`, with `name`.

    mode: greedy (argmax, for evaluation and deployment), sample (pi', for training) or uniform (x_{N+1}).
    """

    def __init__(self, cfg: ChicConfig, params: dict, mode: str = GREEDY, seed: int = 0, record: bool = False,
                 name: str | None = None):
        if mode not in (GREEDY, SAMPLE, UNIFORM):
            raise ValueError(f"mode must be greedy, sample or uniform, not {mode!r}")
        self.cfg, self.params, self.mode = cfg, params, mode
        self.rng = np.random.default_rng(seed)
        self.record = record
        self.name = name or cfg.name
        self.table = speed_table(cfg.speed_model)
        self.trajectory = Trajectory()
        self._key = None
        self._servers: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}

    def reset(self) -> None:
        self.trajectory = Trajectory()
        self._key, self._servers = None, {}

    # -- one action mask / state from the builder
    def _mask(self, view: SlotView, b: AllocationBuilder, n: int) -> np.ndarray:
        cfg = self.cfg
        m = np.zeros(cfg.num_actions, bool)
        for j in range(n):
            if cfg.pair:
                if b.within_limits(j, "bundle"):
                    srv = b.placer.add_bundle(view.worker_demand[j], view.ps_demand[j])
                    if srv is not None:
                        b.placer.remove(srv[0], view.worker_demand[j])
                        b.placer.remove(srv[1], view.ps_demand[j])
                        m[j] = True
            else:
                m[2 * j] = b.within_limits(j, "worker") and self._fits_keeping_complements(view, b, n, j, "worker")
                m[2 * j + 1] = b.within_limits(j, "ps") and self._fits_keeping_complements(view, b, n, j, "ps")
        # starvation guard (ours): no void while no job would train and something still fits
        m[cfg.void] = not m[:-1].any() or any(b.workers(j) and (b.ps(j) or view.allreduce[j]) for j in range(n))
        return m

    @staticmethod
    def _fits_keeping_complements(view: SlotView, b: AllocationBuilder, n: int, j: int, kind: str) -> bool:
        """Whether one more `kind` task of job j fits while every job holding only workers can still get a PS
        and every job holding only PSs a worker (ours). Without this reservation Chic can fill the cluster
        with tasks no job can train with, and since it reuses a schedule until its jobs change, starve forever."""
        demand = view.worker_demand if kind == "worker" else view.ps_demand
        tasks = [demand[j]]
        for k in range(n):
            w, p = b.workers(k) + (k == j and kind == "worker"), b.ps(k) + (k == j and kind == "ps")
            if view.allreduce[k]:
                continue
            if w and not p:
                tasks.append(view.ps_demand[k])
            elif p and not w:
                tasks.append(view.worker_demand[k])
        placed = b.placer.add_bundle(*tasks)
        if placed is None:
            return False
        for srv, d in zip(placed, tasks):
            b.placer.remove(srv, d)
        return True

    def _choose(self, state: np.ndarray, allowed: np.ndarray) -> int:
        if self.mode == UNIFORM:
            return int(self.rng.choice(np.flatnonzero(allowed)))
        z = logits(self.params, state)
        if self.mode == GREEDY:
            return int(np.argmax(np.where(allowed, z, -np.inf)))
        return int(self.rng.choice(len(z), p=masked_probs(z, allowed)))

    def _speed(self, view: SlotView, j: int) -> np.ndarray:
        """Job j's speed by (PS, workers) as Condition (2) believes it: its type's row of the configured table
        for a DL2 job, the view's estimate for an all-reduce job."""
        return view.est_speed[j] if view.allreduce[j] else self.table[int(view.type_idx[j])]

    def decide(self, view: SlotView) -> AllocationBuilder:
        """One decision phase for the first I jobs of the view (rows are by arrival)."""
        cfg = self.cfg
        n = min(cfg.num_jobs, len(view))
        backlog = len(view) - n
        b = AllocationBuilder(view)
        rem = view.remaining_epochs[:n]
        max_steps = n * (cfg.max_workers + cfg.max_ps) + cfg.num_jobs + 1
        self.trajectory.decisions += 1
        for _ in range(max_steps):
            w = np.array([b.workers(j) for j in range(n)], int)
            p = np.array([b.ps(j) for j in range(n)], int)
            mask = self._mask(view, b, n)
            improvable = any(can_improve(self._speed(view, j), int(w[j]), int(p[j]), cfg.pair, view.max_workers,
                                         view.max_ps, bool(view.allreduce[j])) for j in range(n))
            if n == 0 or not mask[:-1].any() or not improvable:
                break  # a state of S': the void action is forced, nothing to learn from it
            state = encode_state(cfg, view.type_idx[:n], rem, w, p, backlog)
            allowed = mask.copy() if cfg.mask_invalid else np.ones_like(mask)
            allowed[cfg.void] = mask[cfg.void]
            a = self._choose(state, allowed)
            if self.record:
                self.trajectory.states.append(state)
                self.trajectory.masks.append(allowed)
                self.trajectory.actions.append(a)
            if a == cfg.void:
                break
            j, kind = decode_action(cfg, a)
            if not mask[a]:  # only reachable with mask_invalid=False: a no-op, punished (r_t2)
                self.trajectory.penalty -= cfg.p1
                continue
            b.add(j, kind)
            if not cfg.pair:
                self.trajectory.penalty += r3_change(w[j], p[j], b.workers(j), b.ps(j), cfg.p2,
                                                     bool(view.allreduce[j]))
        return b

    def __call__(self, view: SlotView) -> Allocation:
        n = min(self.cfg.num_jobs, len(view))
        key = tuple(int(x) for x in view.job_ids[:n])
        idle = bool(np.allclose(view.free, view.capacity))
        if key != self._key or not idle:
            b = self.decide(view)
            self._key = key if idle else None
            self._servers = {int(view.job_ids[j]): (tuple(b.worker_servers[j]), tuple(b.ps_servers[j]))
                             for j in range(n)}
        ws = tuple(self._servers.get(int(job), ((), ()))[0] for job in view.job_ids)
        ps = tuple(self._servers.get(int(job), ((), ()))[1] for job in view.job_ids)
        return Allocation.from_servers(ws, ps)

    def applied(self, view: SlotView, allocation: Allocation, overridden: bool) -> None:
        """Overridden by the guardrails: the cached schedule was not carried out, decide afresh next slot."""
        if overridden:
            self._key, self._servers = None, {}

    def observe(self, reward: float) -> None:
        """Chic learns offline (chic_train), not from the daemon's rewards."""


# ---------------------------------------------------------------- checkpoints

FORMAT = "dl2d-chic"
VERSION = 2  # 2: one-hot over the model catalog's 15 classes, not DL2's eight types


#: The most weights a checkpoint's network may have: the paper's network on a few jobs has about 5 000, and
#: ChicConfig's own bounds (16 layers of 8 192 on 4 096 jobs) would allow 8 GB of them.
MAX_WEIGHTS = 16_000_000
#: The config and meta members' bounds (JSON text; numpy stores 4 bytes a character).
MAX_CONFIG_BYTES = 256 * 1024
MAX_META_BYTES = 4 * 1024 * 1024
#: The largest checkpoint file: MAX_WEIGHTS float64 weights (and their biases), the config, the meta.
MAX_CHECKPOINT_BYTES = 8 * MAX_WEIGHTS + MAX_CONFIG_BYTES + MAX_META_BYTES + 1024 * 1024


class ChicCheckpointError(RuntimeError):
    pass


def save_checkpoint(path: str | Path, cfg: ChicConfig, params: dict, meta: dict | None = None) -> None:
    """An .npz: format, version, config (JSON), meta (JSON) and the arrays as param/<name>; written atomically."""
    path = Path(path)
    arrays = {f"param/{k}": np.asarray(v, float) for k, v in params.items()}
    with atomic_open(path, "wb") as f:
        np.savez(f, format=np.array(FORMAT), version=np.array(VERSION), config=np.array(json.dumps(cfg.to_dict())),
                 meta=np.array(json.dumps(meta or {})), **arrays)


def param_shapes(cfg: ChicConfig) -> dict[str, tuple[int, int] | tuple[int]]:
    """The shape of every parameter the config's network has (``w<i>``: [in, out], ``b<i>``: [out]), as
    :func:`init_params` makes them, without making them."""
    dims = (cfg.state_dim, *cfg.hidden, cfg.num_actions)
    shapes: dict[str, tuple[int, int] | tuple[int]] = {}
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        shapes[f"w{i}"], shapes[f"b{i}"] = (a, b), (b,)
    return shapes


def network_problem(cfg: ChicConfig) -> str | None:
    """What is wrong with the network a checkpoint's config asks for (its sizes whole numbers, its weights at
    most MAX_WEIGHTS), before anything of that size is read or made; None when it is fine."""
    if isinstance(cfg.num_jobs, bool) or not isinstance(cfg.num_jobs, int):
        return f"num_jobs must be an integer, got {cfg.num_jobs!r}"
    weights = sum(math.prod(shape) for shape in param_shapes(cfg).values())
    if weights > MAX_WEIGHTS:
        return f"num_jobs {cfg.num_jobs} and hidden {list(cfg.hidden)} make a network of {weights:,} weights, " \
               f"more than the {MAX_WEIGHTS:,} a checkpoint may have"
    return None


def load_checkpoint(path: str | Path) -> tuple[ChicConfig, dict, dict]:
    """(config, params, meta); ChicCheckpointError (one line) on anything that is not a matching Chic checkpoint.

    The file is untrusted: it is read bounded (a regular file of at most MAX_CHECKPOINT_BYTES), then the
    archive's directory and each member's declared size and .npy header are checked before that member is
    decompressed (dl2d.core.files.NpzArchive), the config before any parameter (its network's size bounded,
    each parameter's shape the one it needs), and every parameter is finite. A zip bomb, a config asking for a
    network of gigabytes or NaN weights each cost no more to refuse than a good checkpoint costs to load."""
    path = Path(path)
    try:
        z = NpzArchive(read_bounded(path, MAX_CHECKPOINT_BYTES))
    except InputFileError as e:
        if e.missing:
            raise ChicCheckpointError(f"{path}: no such checkpoint") from None
        if e.too_large:
            raise ChicCheckpointError(f"{path}: larger than {MAX_CHECKPOINT_BYTES} bytes, more than any Chic "
                                      "checkpoint") from None
        raise ChicCheckpointError(f"{path}: cannot read checkpoint ({e.reason})") from None
    except NpzError as e:
        raise ChicCheckpointError(f"{path}: not a Chic checkpoint (unreadable: {e})") from None
    try:
        fmt = z.text("format", 1024) if "format" in z.names else None
        version = z.integer("version") if "version" in z.names else None
    except NpzError as e:
        raise ChicCheckpointError(f"{path}: not a Chic checkpoint ({e})") from None
    if fmt != FORMAT:
        raise ChicCheckpointError(f"{path}: not a Chic checkpoint (format is not {FORMAT!r})")
    if version != VERSION:
        raise ChicCheckpointError(f"{path}: Chic checkpoint version {version} not supported "
                                  f"(this dl2d reads {VERSION})")
    try:
        cfg = ChicConfig.from_dict(json.loads(z.text("config", MAX_CONFIG_BYTES)))
        meta = json.loads(z.text("meta", MAX_META_BYTES)) if "meta" in z.names else {}
    except (NpzError, TypeError, ValueError, RecursionError) as e:
        raise ChicCheckpointError(f"{path}: bad Chic config: {e}") from None
    problem = network_problem(cfg)
    if problem:
        raise ChicCheckpointError(f"{path}: bad Chic config: {problem}")
    shapes = param_shapes(cfg)
    names = {f"param/{k}": k for k in shapes}
    extra = sorted(n for n in z.names if n.startswith("param/") and n not in names)
    if extra:
        raise ChicCheckpointError(f"{path}: unexpected parameters {extra}")
    for name, k in names.items():  # every parameter's declared size, from the directory, before any is read
        if name not in z.names:
            raise ChicCheckpointError(f"{path}: parameter {k} missing")
        if z.declared_size(name) > _param_bytes(shapes[k]):
            raise ChicCheckpointError(f"{path}: parameter {k} declares {z.declared_size(name)} bytes, its shape "
                                      f"{shapes[k]} needs at most {_param_bytes(shapes[k])}")
    params = {}
    for name, k in names.items():
        try:
            params[k] = z.array(name, _param_bytes(shapes[k]), shapes[k], "f").astype(float)
        except NpzError as e:
            raise ChicCheckpointError(f"{path}: {e}") from None
    return cfg, params, meta


def _param_bytes(shape) -> int:
    """The most an .npy member of ``shape`` may take: float64 data and a header."""
    return 8 * math.prod(shape) + 4096


def load_scheduler(path: str | Path, name: str | None = None) -> ChicScheduler:
    cfg, params, _ = load_checkpoint(path)
    return ChicScheduler(cfg, params, GREEDY, name=name)


def _load(name: str, options: PolicyOptions) -> ChicScheduler:
    sched = load_scheduler(options.checkpoint, name=name)
    if sched.cfg.pair != (name == "chic-pair"):
        raise ChicCheckpointError(f"{options.checkpoint} is a {sched.cfg.name} checkpoint, policy.name is {name!r}")
    return sched


def build(options: PolicyOptions) -> ChicScheduler:
    return _load("chic", options)


def build_pair(options: PolicyOptions) -> ChicScheduler:
    return _load("chic-pair", options)


def _needs_checkpoint(name: str, options: PolicyOptions) -> list[tuple[str, str]]:
    if not options.checkpoint:
        return [("checkpoint", f"policy {name} needs a trained Chic checkpoint (.npz, bench/bench_chic.py)")]
    return []


def check(options: PolicyOptions) -> list[tuple[str, str]]:
    return _needs_checkpoint("chic", options)


def check_pair(options: PolicyOptions) -> list[tuple[str, str]]:
    return _needs_checkpoint("chic-pair", options)
