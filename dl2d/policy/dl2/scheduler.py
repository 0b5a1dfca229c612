"""The DL2 policy as a scheduler: a `SlotView` in, an `Allocation` out (simulator and daemon alike).

Jobs beyond the window size J are scheduled in further windows of J, by arrival, on what the earlier windows
left free (DL2 section 6.5.1).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import jax
import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.policy.dl2.config import PolicyConfig
from dl2d.policy.dl2.job_info import speed_features
from dl2d.policy.dl2.slot import GREEDY, SAMPLE, TEACHER, pad_window, run_window


@dataclass
class WindowRecord:
    """What one window of one slot produced, for training."""

    states: np.ndarray  # [n, state_dim]
    masks: np.ndarray  # [n, A]
    actions: np.ndarray  # [n]
    explored: np.ndarray  # [n]


@dataclass
class Decision:
    allocation: Allocation
    records: list[WindowRecord] = field(default_factory=list)


def decide(cfg: PolicyConfig, params, key, view: SlotView, mode: str = GREEDY, epsilon: float = 0.0,
           targets: tuple[np.ndarray, np.ndarray] | None = None, record: bool = False) -> Decision:
    """Allocate every job of the view, window by window."""
    n = len(view)
    w_srv: list[list[int]] = [[] for _ in range(n)]
    p_srv: list[list[int]] = [[] for _ in range(n)]
    free = view.free
    records = []
    starts = range(0, n, cfg.max_jobs)
    subs = jax.device_get(_split_chain(key, len(starts)))  # the keys of `key, sub = split(key)` per window
    for i, start in enumerate(starts):
        sl = slice(start, min(start + cfg.max_jobs, n))
        win = pad_window(cfg, view.type_idx[sl], view.slots_run[sl], view.remaining_epochs[sl], free, view.capacity,
                         worker_demand=view.worker_demand[sl], ps_demand=view.ps_demand[sl],
                         allreduce=view.allreduce[sl], job_info=window_job_info(cfg, view, sl))
        tw = tu = None
        if targets is not None:
            tw = np.zeros(cfg.max_jobs, np.int32)
            tu = np.zeros(cfg.max_jobs, np.int32)
            tw[: sl.stop - start] = targets[0][sl]
            tu[: sl.stop - start] = targets[1][sl]
        out = run_window(cfg, params, subs[i], win, mode=mode, epsilon=epsilon, target_w=tw, target_u=tu,
                         record=record)
        out = jax.device_get(out)
        steps = int(out.n_steps)
        acts = out.actions[:steps]
        _collect_servers(start, sl, out, steps, w_srv, p_srv)
        free = np.asarray(out.free, dtype=float)
        if record:
            records.append(WindowRecord(out.states[:steps], out.masks[:steps], acts, out.explored[:steps]))
    alloc = Allocation.from_servers(w_srv, p_srv)
    return Decision(alloc, records)


def window_job_info(cfg: PolicyConfig, view: SlotView, rows) -> np.ndarray | None:
    """The speed features of these jobs of the view when the policy describes jobs by them, else None."""
    if cfg.job_encoding != "speed":
        return None
    return speed_features(view.est_speed[rows], view.remaining_epochs[rows], view.allreduce[rows])


@partial(jax.jit, static_argnums=1)
def _split_chain(key, n: int):
    """[n] keys: the sub-keys of n successive `key, sub = jax.random.split(key)`."""

    def step(k, _):
        k, sub = jax.random.split(k)
        return k, sub

    return jax.lax.scan(step, key, None, length=n)[1]


def _collect_servers(start, sl, out, steps, w_srv, p_srv):
    """Per-job server lists of one window: the starting bundles (as the slot loop placed them), then the
    recorded steps (as Python lists: a window has hundreds of steps)."""
    n = sl.stop - sl.start
    for k, (sw, sp) in enumerate(zip(out.bundle_worker_server[:n].tolist(), out.bundle_ps_server[:n].tolist())):
        if sw >= 0:
            w_srv[start + k].append(sw)
        if sp >= 0:
            p_srv[start + k].append(sp)
    for a, sw, sp in zip(out.actions[:steps].tolist(), out.worker_server[:steps].tolist(),
                         out.ps_server[:steps].tolist()):
        j = start + a // 3
        if sw >= 0:
            w_srv[j].append(sw)
        if sp >= 0:
            p_srv[j].append(sp)


class DL2Scheduler:
    """Greedy (deployment) or sampling DL2 policy usable wherever a baseline is."""

    name = "dl2"

    def __init__(self, cfg: PolicyConfig, params, mode: str = GREEDY, seed: int = 0):
        self.cfg, self.params, self.mode = cfg, params, mode
        self.key = jax.random.PRNGKey(seed)

    def __call__(self, view: SlotView) -> Allocation:
        self.key, sub = jax.random.split(self.key)
        return decide(self.cfg, self.params, sub, view, mode=self.mode).allocation


def load_scheduler(checkpoint: str, mode: str = GREEDY) -> DL2Scheduler:
    from dl2d.policy.checkpoint import load

    ckpt = load(checkpoint)
    return DL2Scheduler(ckpt.config, ckpt.params, mode=mode)


__all__ = ["DL2Scheduler", "Decision", "WindowRecord", "decide", "load_scheduler", "window_job_info", "GREEDY",
           "SAMPLE", "TEACHER"]
