"""Elastic with its rule chosen by a learned classifier: ``elastic-chooser``.

Why: elastic's best setting depends on how the jobs are configured. On workloads as users submit them (mostly
one GPU a job) its default, efficiency 0.6, is best; on workloads of tuned jobs (several GPUs and large batches
each) a higher threshold with whole nodes for multi-node jobs is 9 % better, and the default there is 9 % worse
(docs/BENCHMARKS.md, "Today's world"). bench/bench_mpc.py chooses among such rules every few slots by simulating
each ahead, which finds more than any one rule, at a second or two a choice. This module learns that choice: a
linear softmax over a dozen numbers that describe the cluster's state (:func:`state_features`: how many jobs,
how many wait, the work left, what the jobs ask for and how well they scale), fitted to the lookahead's costs
on generated workloads (:func:`fit`, least expected regret), deciding in microseconds. What it picks among are
:data:`RULES`, elastic's efficiency threshold with or without whole nodes (dl2d.policy.elastic.srtf).

The pure side is :func:`state_features`, :class:`Chooser` (its numbers, :meth:`Chooser.probs`) and :func:`fit`;
:class:`ChooserPolicy` keeps the chosen rule for ``every`` slots, as the lookahead it learned from did.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dl2d.core.contract import Allocation, SlotView
from dl2d.core.files import InputFileError, read_bounded
from dl2d.policy.elastic.srtf import efficient_sizes, elastic_srtf, node_workers, size_curves
from dl2d.policy.baselines.heuristics import remaining_time_estimate
from dl2d.policy.registry import IgnoresFeedback, PolicyOptions

#: The rules a chooser picks among: elastic's efficiency threshold, ``n`` for whole nodes for multi-node jobs.
RULES = ("0.6", "0.8", "0.7n", "0.8n")

#: What :func:`state_features` gives, in order.
FEATURES = ("log jobs", "waiting share", "log work per GPU (h)", "share asking for more than one worker",
            "mean log2 workers asked", "share efficient above a node (0.6)", "mean log2 efficient size (0.6)",
            "mean log2 efficient size (0.8)", "log efficient GPUs per GPU (0.6)", "share running on several nodes",
            "log arrivals in the last hour per GPU")


def parse_rule(text: str) -> tuple[float, bool]:
    """(efficiency, whole nodes) of a rule's name (``0.8``, ``0.7n``); ValueError naming what is wrong."""
    whole = text.endswith("n")
    try:
        efficiency = float(text[:-1] if whole else text)
    except ValueError:
        raise ValueError(f"rule {text!r} is not an efficiency, optionally followed by n") from None
    if not 0 < efficiency <= 1:
        raise ValueError(f"rule {text!r}: efficiency {efficiency} is not in (0, 1]")
    return efficiency, whole


def apply_rule(view: SlotView, text: str) -> Allocation:
    """Elastic under the rule ``text`` (:func:`parse_rule`)."""
    efficiency, whole = parse_rule(text)
    return elastic_srtf(view, efficiency=efficiency, node_workers=node_workers(view) if whole else 0)


def state_features(view: SlotView) -> np.ndarray:
    """[len(FEATURES)] the cluster's state as the chooser reads it (all 0 for a view with no jobs). Pure."""
    n = len(view)
    if not n:
        return np.zeros(len(FEATURES))
    gpus = max(float(np.sum(np.asarray(view.capacity, float)[:, 0])), 1.0)
    curves = size_curves(view)
    eff6, eff8 = efficient_sizes(curves, 0.6), efficient_sizes(curves, 0.8)
    node = np.maximum(node_workers(view), 1)
    asked = np.maximum(view.requested, 1)
    work_h = float(np.sum(np.minimum(remaining_time_estimate(view), 1e9))) / 3600.0
    servers = view.prev_worker_servers or ((),) * n
    spread = np.array([len(set(s)) > 1 for s in servers], bool)
    running = np.asarray(view.prev_workers) > 0
    recent = np.sum(np.asarray(view.arrival_slot) > view.slot - 3600.0 / view.slot_seconds)
    return np.array([
        np.log1p(n), float(np.mean(~running)), np.log1p(work_h / gpus), float(np.mean(asked > 1)),
        float(np.mean(np.log2(asked))), float(np.mean(eff6 > node)), float(np.mean(np.log2(eff6))),
        float(np.mean(np.log2(eff8))), np.log1p(float(np.sum(eff6)) / gpus),
        float(np.sum(spread & running)) / max(int(np.sum(running)), 1), np.log1p(recent / gpus)])


#: A chooser file is a few kilobytes (the shipped one 3 KB); a megabyte is not one.
MAX_FILE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class Chooser:
    """A linear softmax over the standardised features: ``weights`` [F + 1, R] (the last row the bias)."""

    rules: tuple[str, ...]
    mean: np.ndarray  # [F]
    scale: np.ndarray  # [F]
    weights: np.ndarray  # [F + 1, R]
    meta: dict

    def __post_init__(self):
        f, r = len(FEATURES), len(self.rules)
        for rule in self.rules:
            parse_rule(rule)
        shapes = {"mean": (f,), "scale": (f,), "weights": (f + 1, r)}
        for name, shape in shapes.items():
            v = np.asarray(getattr(self, name), float)
            if v.shape != shape or not np.all(np.isfinite(v)):
                raise ValueError(f"chooser {name} must be {shape} finite numbers, got shape {v.shape}")
        if np.any(np.asarray(self.scale) <= 0):
            raise ValueError("chooser scale must be positive")

    def logits(self, x: np.ndarray) -> np.ndarray:
        """[..., R] for features ``x`` [..., F]."""
        z = (np.asarray(x, float) - self.mean) / self.scale
        return z @ np.asarray(self.weights)[:-1] + np.asarray(self.weights)[-1]

    def probs(self, x: np.ndarray) -> np.ndarray:
        lg = self.logits(x)
        e = np.exp(lg - lg.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def choose(self, view: SlotView) -> int:
        return int(np.argmax(self.logits(state_features(view))))

    def to_dict(self) -> dict:
        return {"format": "dl2d-rule-chooser/1", "features": list(FEATURES), "rules": list(self.rules),
                "mean": [float(v) for v in self.mean], "scale": [float(v) for v in self.scale],
                "weights": [[float(v) for v in row] for row in np.asarray(self.weights)], "meta": self.meta}

    @classmethod
    def from_dict(cls, d: dict) -> "Chooser":
        if not isinstance(d, dict) or d.get("format") != "dl2d-rule-chooser/1":
            raise ValueError("not a rule chooser (format dl2d-rule-chooser/1)")
        if d.get("features") != list(FEATURES):
            raise ValueError("the chooser was fitted on other features than this version computes")
        return cls(tuple(d["rules"]), np.asarray(d["mean"], float), np.asarray(d["scale"], float),
                   np.asarray(d["weights"], float), dict(d.get("meta") or {}))

    def save(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def load(cls, path) -> "Chooser":
        """The chooser of a file :meth:`save` wrote, read bounded (MAX_FILE_BYTES, a regular file); ValueError
        naming the file and what is wrong."""
        try:
            d = json.loads(read_bounded(path, MAX_FILE_BYTES).decode("utf-8"))
        except InputFileError as e:
            raise ValueError(f"cannot read rule chooser {path}: {e.reason}") from None
        except (ValueError, RecursionError) as e:  # not UTF-8, not JSON, nested too deep, a 5000-digit integer
            raise ValueError(f"cannot read rule chooser {path}: {str(e).splitlines()[0] if str(e) else e!r}") \
                from None
        try:
            return cls.from_dict(d)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: {e}") from None


def fit(x: np.ndarray, costs: np.ndarray, rules=RULES, l2: float = 1e-3, steps: int = 3000, lr: float = 0.5,
        meta: dict | None = None) -> Chooser:
    """The chooser of least expected regret on samples ``x`` [N, F] whose rules cost ``costs`` [N, R] (the
    lookahead's: job-slots; lower is better): minimise mean_i sum_r p_ir (c_ir - min_r c_ir) / s + l2 |W|^2,
    ``s`` the mean regret of a uniform choice (so ``lr`` and ``l2`` do not depend on the costs' unit). A sample
    where every rule costs the same teaches nothing and weighs nothing. Full-batch gradient descent; pure."""
    x, costs = np.asarray(x, float), np.asarray(costs, float)
    if x.ndim != 2 or x.shape[1] != len(FEATURES) or costs.shape != (len(x), len(rules)):
        raise ValueError(f"fit needs x [N, {len(FEATURES)}] and costs [N, {len(rules)}], got {x.shape}, {costs.shape}")
    regret = costs - costs.min(axis=1, keepdims=True)
    s = max(float(regret.mean()), 1e-12)
    regret = regret / s
    mean, scale = x.mean(axis=0), x.std(axis=0)
    scale = np.where(scale > 1e-9, scale, 1.0)
    z = np.concatenate([(x - mean) / scale, np.ones((len(x), 1))], axis=1)
    w = np.zeros((z.shape[1], len(rules)))
    for _ in range(steps):
        lg = z @ w
        p = np.exp(lg - lg.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        expected = np.sum(p * regret, axis=1, keepdims=True)
        grad_logits = p * (regret - expected) / len(x)  # d(sum_r p_r c_r)/d logits
        grad = z.T @ grad_logits
        grad[:-1] += 2 * l2 * w[:-1]
        w -= lr * grad
    lg = z @ w
    p = np.exp(lg - lg.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    info = {"samples": int(len(x)), "l2": float(l2), "steps": int(steps),
            "expected_regret": round(float(np.mean(np.sum(p * regret, axis=1))), 4),
            "argmax_regret": round(float(np.mean(regret[np.arange(len(x)), np.argmax(lg, axis=1)])), 4),
            "uniform_regret": 1.0, **(meta or {})}
    return Chooser(tuple(rules), mean, scale, w, info)


class ChooserPolicy(IgnoresFeedback):
    """Elastic under the rule a :class:`Chooser` picks, kept for ``every`` slots (chosen again at once when the
    slot goes back: a new run)."""

    def __init__(self, chooser: Chooser, every: int = 10, name: str = "elastic-chooser"):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.chooser, self.every, self.name = chooser, int(every), name
        self.rule, self.chosen_at, self.counts = 0, None, [0] * len(chooser.rules)

    def __call__(self, view: SlotView) -> Allocation:
        if self.chosen_at is None or not 0 <= view.slot - self.chosen_at < self.every:
            self.rule, self.chosen_at = self.chooser.choose(view), view.slot
        self.counts[self.rule] += 1
        return apply_rule(view, self.chooser.rules[self.rule])


#: The chooser that ships (made by bench/bench_chooser.py; docs/BENCHMARKS.md says how and how it scores).
SHIPPED = Path(__file__).with_name("pretrained") / "chooser-today.json"


def check(options: PolicyOptions) -> list[tuple[str, str]]:
    if not options.checkpoint and not SHIPPED.exists():
        return [("checkpoint", "elastic-chooser ships no chooser here: give one (python bench/bench_chooser.py "
                 "--out FILE)")]
    return []


def build(options: PolicyOptions) -> ChooserPolicy:
    return ChooserPolicy(Chooser.load(options.checkpoint or SHIPPED))
