"""The training workload: a one-hidden-layer MLP regression on synthetic data (numpy).

Everything here is pure and deterministic given :class:`TrainConfig`:

* data set: ``n_samples`` inputs ``X ~ N(0, 1)`` and targets from a fixed random
  teacher network plus noise (every worker regenerates it from the seed, i.e.
  "the training data set is copied" to the worker);
* data order: step ``s`` (= model version in synchronous mode) is the global
  batch ``perm_e[k*B:(k+1)*B]`` with ``e = s // steps_per_epoch``,
  ``k = s % steps_per_epoch`` and ``perm_e`` a seeded permutation per epoch;
* a worker of rank ``r`` among ``W`` takes ``np.array_split(batch, W)[r]`` and
  pushes the *sum* of per-sample gradients and its sample count; the PS divides
  the summed gradient by the global batch size, i.e. the exact full-batch mean
  whatever ``W`` is (DL2 section 3.1: fixed global batch in synchronous mode);
* optimiser: SGD with momentum, ``m = mu*m + g; p -= lr*m`` elementwise, so it
  can be applied block by block on the PSs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from .assignment import Block, make_blocks


def parse_size(s: str | int) -> int:
    """'25M' -> 25_000_000, '64k' -> 64_000, '1000' -> 1000."""
    if isinstance(s, int):
        return s
    s = s.strip().lower()
    mult = {"k": 10**3, "m": 10**6, "g": 10**9}.get(s[-1:], 1)
    return int(float(s[:-1] if mult != 1 else s) * mult)


@dataclass
class TrainConfig:
    n_samples: int = 512
    d_in: int = 8
    hidden: int = 16
    d_out: int = 2
    global_batch: int = 32
    lr: float = 0.05
    momentum: float = 0.9
    epochs: int = 2
    seed: int = 0
    sync: bool = True
    max_block: int = 64

    @classmethod
    def for_model_size(cls, n_params: int, **kw) -> "TrainConfig":
        """A config whose MLP has about ``n_params`` float32 parameters."""
        d_in, d_out = kw.pop("d_in", 64), kw.pop("d_out", 10)
        hidden = max(1, round((n_params - d_out) / (d_in + 1 + d_out)))
        kw.setdefault("max_block", max(256, n_params // 256))
        kw.setdefault("lr", 0.01)
        return cls(d_in=d_in, d_out=d_out, hidden=hidden, **kw)

    @property
    def steps_per_epoch(self) -> int:
        return max(1, self.n_samples // self.global_batch)

    @property
    def total_steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    def shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        return [("W1", (self.d_in, self.hidden)), ("b1", (self.hidden,)),
                ("W2", (self.hidden, self.d_out)), ("b2", (self.d_out,))]

    @property
    def n_params(self) -> int:
        return self.d_in * self.hidden + self.hidden + self.hidden * self.d_out + self.d_out

    def blocks(self) -> list[Block]:
        return make_blocks(self.shapes(), self.max_block)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def init_params(cfg: TrainConfig) -> np.ndarray:
    rng = np.random.default_rng(cfg.seed)
    parts = []
    for name, shape in cfg.shapes():
        if name.startswith("W"):
            parts.append(rng.standard_normal(shape).astype(np.float32).ravel() / np.float32(np.sqrt(shape[0])))
        else:
            parts.append(np.zeros(shape, np.float32).ravel())
    return np.concatenate(parts).astype(np.float32)


def make_dataset(cfg: TrainConfig) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(cfg.seed + 7919)
    X = rng.standard_normal((cfg.n_samples, cfg.d_in)).astype(np.float32)
    th = min(cfg.hidden, 32)
    A = rng.standard_normal((cfg.d_in, th)).astype(np.float32) / np.float32(np.sqrt(cfg.d_in))
    B = rng.standard_normal((th, cfg.d_out)).astype(np.float32) / np.float32(np.sqrt(th))
    Y = (np.tanh(X @ A) @ B + 0.05 * rng.standard_normal((cfg.n_samples, cfg.d_out))).astype(np.float32)
    return X, Y


def batch_indices(cfg: TrainConfig, step: int) -> np.ndarray:
    """Sample indices of the global batch of (synchronous) step ``step``."""
    epoch, k = divmod(int(step), cfg.steps_per_epoch)
    perm = np.random.default_rng([cfg.seed, 104729, epoch]).permutation(cfg.n_samples)
    return perm[k * cfg.global_batch:(k + 1) * cfg.global_batch]


def async_batch_indices(cfg: TrainConfig, worker_id: int, local_step: int) -> np.ndarray:
    """Asynchronous mode: each worker samples its own batch of ``global_batch`` samples."""
    rng = np.random.default_rng([cfg.seed, 15485863, worker_id, local_step])
    return rng.integers(0, cfg.n_samples, size=cfg.global_batch)


def worker_slice(indices: np.ndarray, rank: int, n_workers: int) -> np.ndarray:
    return np.array_split(indices, n_workers)[rank]


def unflatten(cfg: TrainConfig, flat: np.ndarray) -> dict[str, np.ndarray]:
    out, off = {}, 0
    for name, shape in cfg.shapes():
        n = int(np.prod(shape))
        out[name] = flat[off:off + n].reshape(shape)
        off += n
    return out


def grad_sum(cfg: TrainConfig, flat: np.ndarray, X: np.ndarray, Y: np.ndarray) -> tuple[np.ndarray, float]:
    """Sum over samples of the gradient of 0.5*||mlp(x)-y||^2, and the summed loss."""
    p = unflatten(cfg, flat)
    H = np.tanh(X @ p["W1"] + p["b1"])
    err = H @ p["W2"] + p["b2"] - Y
    dH = (err @ p["W2"].T) * (1.0 - H * H)
    g = np.concatenate([(X.T @ dH).ravel(), dH.sum(0), (H.T @ err).ravel(), err.sum(0)])
    return g.astype(np.float32, copy=False), float(0.5 * np.sum(err * err))


def loss(cfg: TrainConfig, flat: np.ndarray, X: np.ndarray, Y: np.ndarray) -> float:
    return grad_sum(cfg, flat, X, Y)[1] / len(X)


def sgd_update(p: np.ndarray, m: np.ndarray, g: np.ndarray, lr: float, mu: float) -> None:
    """In-place momentum SGD on one block (same arithmetic on PS and reference)."""
    m *= np.float32(mu)
    m += g
    p -= np.float32(lr) * m


def reference_train(cfg: TrainConfig, start: int, stop: int, params: np.ndarray | None = None,
                    momentum: np.ndarray | None = None, n_split: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Single-process synchronous training of steps ``[start, stop)``.

    ``n_split`` emulates the gradient sum being done in that many parts
    (it only changes float rounding).
    """
    X, Y = make_dataset(cfg)
    p = init_params(cfg) if params is None else params.astype(np.float32).copy()
    m = np.zeros_like(p) if momentum is None else momentum.astype(np.float32).copy()
    for s in range(start, stop):
        idx = batch_indices(cfg, s)
        g = np.zeros_like(p)
        for r in range(n_split):
            sl = worker_slice(idx, r, n_split)
            if len(sl):
                g += grad_sum(cfg, p, X[sl], Y[sl])[0]
        g /= np.float32(len(idx))
        sgd_update(p, m, g, cfg.lr, cfg.momentum)
    return p, m
