"""Heterogeneous servers whose performance fluctuates: per-server speed factors, seeded.

A server's speed at slot t is  base[s] * exp(x_t[s]):
- `base` comes from speed classes (e.g. GPU generations), assigned to servers by a seeded draw;
- `x` is a mean-reverting random walk in log space, x_{t+1} = (1 - reversion) * x_t + sigma * N(0, 1),
  clipped to [-bound, bound], standing in for the contention from co-located work that the dual-agent
  paper describes (its Figure 1). Its innovations come from their own generator seeded by
  (seed, slot), never from the simulator's main generator, so turning this on or off leaves every other
  random draw of a run unchanged, and a slot's step stays a pure function of its inputs.

A job trains at the speed of its slowest worker's server (synchronous training waits for the straggler,
as the paper's "the performance bottleneck lies in the machine with the worst ... performance").
"""
from __future__ import annotations

import functools

import numpy as np

#: Relative training speeds of GPU generations (an assumption for experiments, roughly V100 : P100 : K80
#: on ResNet-50-class training); use them as `SimConfig.server_speed_classes`.
GPU_GENERATIONS: dict[str, float] = {"v100": 1.0, "p100": 0.6, "k80": 0.3}
THREE_GENERATIONS: tuple[float, ...] = tuple(GPU_GENERATIONS.values())


@functools.lru_cache(maxsize=64)
def _base(num_servers: int, classes: tuple[float, ...], seed: int) -> np.ndarray:
    if not classes:
        out = np.ones(num_servers)
    else:
        rng = np.random.default_rng([int(seed), 0x48455445])
        out = np.asarray(classes, float)[rng.integers(len(classes), size=num_servers)]
    out.setflags(write=False)
    return out


def base_speeds(num_servers: int, classes=(), seed: int = 0) -> np.ndarray:
    """Per-server base speed factor (read-only): all 1 without classes, else a seeded draw of the classes."""
    classes = tuple(float(c) for c in classes)
    if any(c <= 0 for c in classes):
        raise ValueError("server speed classes must be > 0")
    return _base(int(num_servers), classes, int(seed))


def walk_step(x: np.ndarray, slot: int, sigma: float, reversion: float = 0.1, bound: float = 0.5,
              seed: int = 0) -> np.ndarray:
    """One step of the log-speed random walk; pure given (x, slot, parameters, seed)."""
    x = np.asarray(x, float)
    if sigma <= 0:
        return x.copy()
    eps = np.random.default_rng([int(seed), 1, int(slot)]).standard_normal(len(x))
    return np.clip((1.0 - reversion) * x + sigma * eps, -bound, bound)


def speeds(base: np.ndarray, x: np.ndarray | None) -> np.ndarray:
    """Current per-server speeds from the base speeds and the walk state (None = no deviation)."""
    return np.array(base, float) if x is None else base * np.exp(x)


def bottleneck_speed(server_speed: np.ndarray, worker_servers) -> float:
    """Speed factor of a job: the slowest server among its workers' (1 for a job without workers)."""
    return float(min((server_speed[s] for s in worker_servers), default=1.0))
