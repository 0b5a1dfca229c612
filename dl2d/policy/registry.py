"""One registry of scheduling policies: the daemon, `dl2ctl sim`, `dl2ctl train` and the benchmarks build every
policy through it.

A :class:`Policy` is a :class:`dl2d.core.contract.Scheduler` (calling it decides a slot: a view in, an
allocation out, so every policy runs in the simulator) that also hears what happened to its decision
(:meth:`Policy.applied`: carried out, or overridden by the daemon's guardrails) and the slot's reward
(:meth:`Policy.observe`). A policy that learns online also has a ``version`` and ``save`` (:class:`Learner`).

Each name maps to a :class:`PolicyEntry`: a factory from :class:`PolicyOptions`, the checks of those options
(each problem names the option), and what kind of policy it is. :data:`CATALOG` lists every policy of the
package, its factory and checks named as ``"module:function"``: a policy's module is imported only when that
policy is checked or built, so the daemon's process holds the modules of the policy it runs and no other
(docs/ARCHITECTURE.md: no simulator module in the daemon's decision path, at run time too). The Kubernetes
scheduler's plugin registry is the model: names to factories, the wiring knows no policy by name;
:func:`register` adds one from outside the package.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

from dl2d.core.contract import Allocation, SlotView

#: How tasks are placed on servers: the policy's own placement, or DLTAP re-placing the policy's tasks.
PLACEMENTS = ("balance", "dltap")
#: how a policy treats a job that lets the scheduler choose its total batch (PolicyOptions.batch)
BATCH_RULES = ("fixed", "goodput")


@runtime_checkable
class Policy(Protocol):
    name: str

    def __call__(self, view: SlotView) -> Allocation:
        """Decide the slot."""

    def applied(self, view: SlotView, allocation: Allocation, overridden: bool) -> None:
        """What was carried out for the view this policy last decided: its own allocation, or the fallback's
        when the guardrails overrode it (``overridden``)."""

    def observe(self, reward: float) -> object:
        """The reward of the slot just carried out (DL2 eq. 1)."""


@runtime_checkable
class Learner(Protocol):
    """A policy that learns online: the daemon records its version with each decision and checkpoints it."""

    version: int

    def save(self, path: str, meta: dict | None = None) -> None: ...


class IgnoresFeedback:
    """The Policy hooks of a policy that learns nothing from what happens to its decisions or from the rewards:
    the heuristics, including those that keep state of their own from the views they see (Tiresias's attained
    service, Optimus's observed speeds)."""

    def applied(self, view: SlotView, allocation: Allocation, overridden: bool) -> None:
        pass

    def observe(self, reward: float) -> None:
        pass


class StatelessPolicy(IgnoresFeedback):
    """A plain scheduler function as a Policy: it keeps no state, so what happens to its decisions and the
    rewards change nothing (the heuristics)."""

    def __init__(self, fn: Callable[[SlotView], Allocation], name: str):
        self.fn, self.name = fn, name

    def __call__(self, view: SlotView) -> Allocation:
        return self.fn(view)

    def __repr__(self) -> str:
        return f"StatelessPolicy({self.name})"


#: Which jobs an online learner samples a pair for (dl2d.policy.target.online): "every" job, or only those
#: "resizing" anyway (not yet running, or whose greedy pair changes what they hold).
ONLINE_EXPLORE = ("every", "resizing")


@dataclass(frozen=True)
class PolicyOptions:
    """What a policy may be built with; each entry's ``check`` says which options it needs."""

    checkpoint: str = ""  # trained parameters (learned policies)
    seed: int = 0
    online_rl: bool = False  # learn from every slot's reward (policies with ``online``)
    allow_untrained: bool = False  # a learned policy without a checkpoint: random initial parameters
    resume: str = ""  # an online learner's own checkpoint, preferred over ``checkpoint`` when it exists
    tetris_threshold: int | None = None  # bundles Tetris gives a job before the next (default: the per-job max)
    speed_model: str = "measured"  # the speed table the oracle knows (simulator benchmarks only)
    world: str = "today"  # the world it schedules (dl2d.sim.worlds): a learned policy's pretrained default
    fallback: str = "drf"  # the heuristic an online learner is measured against (dl2d.policy.target.online)
    online_window: int = 8  # slots per online update, and per check of the revert rule (dl2-target)
    revert_margin: float = 0.2  # revert when a window scores below 1 - margin of the fallback's (dl2-target)
    online_temperature: float = 0.5  # dl2-target online: samples from softmax(logits / this); < 1 explores less
    online_explore: str = "every"  # dl2-target online: which jobs sample ("every"; "resizing": those that restart anyway)
    #: a job of more workers than a node holds gets whole nodes (8, 12, ... on nodes of 4 GPUs), as sites give
    #: multi-node jobs: none then shares a node with another (policies with "whole_nodes" in their options)
    whole_nodes: bool = False
    #: "reference": the rules of the Pollux artifact's simulator for the baselines it ran (Tiresias's queues,
    #: Optimus+Oracle's replica cap; policies with "baseline_rules" in their options), to compare with its results
    baseline_rules: str = "dl2d"
    #: "goodput": every job that lets the scheduler choose its batch gets, at each (re)start, the batch of the
    #: highest goodput on its GPUs (dl2d.policy.elastic.goodput; any policy); "fixed": batches as submitted
    batch: str = "fixed"


def no_problems(options: PolicyOptions) -> list[tuple[str, str]]:
    return []


def _resolve(ref):
    """A factory or check given as ``"module:function"``, imported now; a callable as it is."""
    if callable(ref):
        return ref
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class PolicyEntry:
    name: str
    summary: str
    #: the factory, or its ``"module:function"`` (imported when the policy is first built)
    build: Callable[[PolicyOptions], Policy] | str
    #: [(option, problem)] of the options, or its ``"module:function"``
    check: Callable[[PolicyOptions], list[tuple[str, str]]] | str = no_problems
    heuristic: bool = False  # a hand-written rule: a guardrail fallback and a teacher for supervised warm-up
    learned: bool = False  # trained parameters (a checkpoint) decide
    trained_by: str = ""  # the command that trains its checkpoint
    online: bool = False  # can learn online from the daemon's rewards
    daemon: bool = True  # fit for a real cluster (the oracle knows the simulator's truth: not)
    #: its rule hands every idle GPU to a job that can use it: no job is left below what it could use beside idle
    #: GPUs for more than dl2d.daemon.conservation.CLAIM_SLOTS slots in a row (tests/daemon/test_conservation.py)
    work_conserving: bool = False
    options: tuple[str, ...] = field(default=())  # the PolicyOptions fields it reads


_P = "dl2d.policy."
#: Every policy of the package, by room (dl2d.policy's docstring): the recommended policy and its fallback
#: first, then the baselines, the DL2 paper's policy, planning in its world, the other seeds, the yardsticks.
CATALOG = (
    # dl2d's own, for today's all-reduce clusters
    PolicyEntry("elastic", "elastic shortest-remaining-work-first: efficient sizes in SRTF order, spare GPUs by "
                "marginal gain, few restarts", _P + "elastic.srtf:build", heuristic=True, options=("whole_nodes",)),
    PolicyEntry("elastic-chooser", "elastic with its rule (efficiency threshold, whole nodes) chosen every 10 slots "
                "by a learned classifier of the cluster's state, fitted to a lookahead's choices",
                _P + "elastic.chooser:build", _P + "elastic.chooser:check", learned=True,
                trained_by="python bench/bench_chooser.py", options=("checkpoint",)),
    PolicyEntry("dl2-target", "DL2 target sizes: a learned (workers, PS) for every job, shortest remaining work "
                "first; slot-level PPO in the JAX simulator, and online", _P + "target.entry:build",
                _P + "target.entry:check", learned=True, trained_by="dl2ctl train --policy dl2-target", online=True,
                options=("checkpoint", "seed", "allow_untrained", "online_rl", "resume", "fallback", "online_window",
                         "revert_margin", "online_temperature", "online_explore", "whole_nodes")),
    # the baselines
    PolicyEntry("slurm", "Slurm as it is: each job exactly what it asked for, FIFO with EASY backfill, never "
                "resized (the baseline without dl2d)", _P + "baselines.slurm_fifo:build", heuristic=True),
    PolicyEntry("tiresias", "Tiresias: discretised two-dimensional least-attained-service, each job what it asked "
                "for, preemptive, no knowledge of job length", _P + "baselines.tiresias:build", heuristic=True,
                options=("baseline_rules",)),
    PolicyEntry("pollux", "Pollux: each job's GPUs by a cluster-wide genetic search over goodput (throughput x "
                "statistical efficiency), its batch with them (simulator only: it reads the measured tables)",
                _P + "baselines.pollux:build", daemon=False, options=("seed",)),
    PolicyEntry("drf", "dominant resource fairness: progressive filling by dominant share",
                _P + "baselines.heuristics:build_drf", heuristic=True, work_conserving=True),
    PolicyEntry("tetris", "packing alignment + shortest remaining time, bundles up to a threshold",
                _P + "baselines.heuristics:build_tetris", _P + "baselines.heuristics:check_tetris", heuristic=True,
                options=("tetris_threshold",), work_conserving=True),
    PolicyEntry("fifo", "first in, first out: the earliest job takes all it may", _P + "baselines.heuristics:build_fifo",
                heuristic=True, work_conserving=True),
    PolicyEntry("srtf", "shortest remaining (estimated) time first", _P + "baselines.heuristics:build_srtf",
                heuristic=True, work_conserving=True),
    PolicyEntry("optimus", "Optimus: greedy marginal gain per unit of dominant resource on a speed model it fits to "
                "what it observes of each job (PS jobs: their type's parametric fit)", _P + "baselines.optimus:build",
                heuristic=True),
    PolicyEntry("optimus-relative", "Optimus's greedy rule valuing a task by the share of a job's remaining time it "
                "cuts (not the seconds), on the same fitted speed models: favours no job for being long",
                _P + "baselines.optimus:build_relative", heuristic=True),
    # the DL2 paper's policy network, and planning in its world
    PolicyEntry("dl2", "DL2: a policy network trained by imitation, then reinforcement learning",
                _P + "dl2.entry:build", _P + "dl2.entry:check", learned=True, trained_by="dl2ctl train", online=True,
                options=("checkpoint", "seed", "online_rl", "allow_untrained", "resume")),
    PolicyEntry("lp-lookahead", "plans every slot with the JCT bound's program on a speed table learned from "
                "simulated runs (dl2d.policy.planning.learned_speeds), then tries local moves of that plan, each "
                "scored by 3 slots simulated on the table; seconds a slot at tens of jobs",
                _P + "planning.lp_lookahead:build", _P + "planning.lp_lookahead:check",
                trained_by="python bench/bench_learned_speeds.py", options=("world",)),
    PolicyEntry("dl2-plan-checked", "DL2 world: a target-size network reading the planner's plan on the learned "
                "speed table and proposing departures from it, each kept only where 3 slots simulated on the table "
                "say it helps; a few program solves a slot", _P + "planning.plan_net:build_checked",
                _P + "planning.plan_net:check", learned=True, trained_by="python bench/bench_plan_net.py",
                options=("checkpoint", "world")),
    # the other seeds
    PolicyEntry("chic", "Chic: cross-entropy-method policy over the first I jobs' workers and PS",
                _P + "seeds.chic:build", _P + "seeds.chic:check", learned=True, trained_by="bench/bench_chic.py",
                options=("checkpoint",)),
    PolicyEntry("chic-pair", "Chic-Pair: Chic adding a worker and a PS together", _P + "seeds.chic:build_pair",
                _P + "seeds.chic:check_pair", learned=True, trained_by="bench/bench_chic.py", options=("checkpoint",)),
    PolicyEntry("dual-agent", "dual-agent: an ordering agent's priorities, a placement agent's RWGP speeds",
                _P + "seeds.dual_agent:build", options=("seed",)),
    # yardsticks of the simulator (they read its truth: not for a real cluster)
    PolicyEntry("optimus-oracle", "Optimus on the measured speed table the simulator trains with (less "
                "interference and noise): an upper reference for simulator benchmarks",
                _P + "baselines.optimus:build_oracle", daemon=False, options=("baseline_rules",)),
    PolicyEntry("oracle", "the speed oracle: every job its fastest configuration on the simulator's own speed "
                "table (a JCT lower bound; simulator benchmarks only)", _P + "baselines.oracle:build", daemon=False,
                options=("speed_model",)),
)
_ENTRIES: dict[str, PolicyEntry] = {e.name: e for e in CATALOG}


def register(entry: PolicyEntry) -> PolicyEntry:
    """Add a policy from outside the package (listed after the catalog's); a second entry under the same name
    is a bug (ValueError)."""
    if entry.name in _ENTRIES and _ENTRIES[entry.name] is not entry:
        raise ValueError(f"policy {entry.name!r} is registered twice")
    _ENTRIES[entry.name] = entry
    return entry


def entries() -> dict[str, PolicyEntry]:
    """Every registered policy by name, in :data:`CATALOG`'s order, then in the order of :func:`register`;
    nothing is imported."""
    return dict(_ENTRIES)


def names(*, heuristic: bool | None = None, learned: bool | None = None, daemon: bool | None = None,
          reads: str | None = None) -> tuple[str, ...]:
    """Policy names, optionally only those of one kind, or (``reads``) those that read that PolicyOptions field."""
    return tuple(n for n, e in entries().items()
                 if (heuristic is None or e.heuristic == heuristic) and (learned is None or e.learned == learned)
                 and (daemon is None or e.daemon == daemon) and (reads is None or reads in e.options))


def get(name: str) -> PolicyEntry:
    """The entry of ``name``; ValueError naming the known policies otherwise."""
    known = entries()
    if name not in known:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(known)}")
    return known[name]


def problems(name: str, options: PolicyOptions = PolicyOptions()) -> list[tuple[str, str]]:
    """(option, problem) for every reason ``name`` cannot be built with ``options``; [] when it can."""
    try:
        entry = get(name)
    except ValueError as e:
        return [("name", str(e))]
    return list(_resolve(entry.check)(options))


class PolicyBuildError(ValueError):
    """A policy that cannot be built; the message names the policy and the option."""


def build(name: str, options: PolicyOptions = PolicyOptions(), placement: str = "balance",
          trim: bool = False) -> Policy:
    """The policy ``name`` built with ``options``, its tasks re-placed by DLTAP when ``placement`` is "dltap"
    (``trim``: the counts become the tasks placed, as the daemon's guardrails require).

    Raises PolicyBuildError (the first problem, naming the option) when the options do not fit the policy or
    the factory fails (e.g. an unreadable checkpoint)."""
    if placement not in PLACEMENTS:
        raise PolicyBuildError(f"placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if options.batch not in BATCH_RULES:
        raise PolicyBuildError(f"batch must be one of {', '.join(BATCH_RULES)}, got {options.batch!r}")
    found = problems(name, options)
    if found:
        option, msg = found[0]
        raise PolicyBuildError(f"policy {name}: {option}: {msg}")
    try:
        policy = _resolve(get(name).build)(options)
    except PolicyBuildError:
        raise
    except (OSError, ValueError, RuntimeError) as e:  # checkpoint errors and the like, never a traceback
        raise PolicyBuildError(f"policy {name}: {e}") from None
    if placement == "dltap":
        from dl2d.policy.seeds.dltap import with_dltap

        policy = with_dltap(policy, trim=trim)
    if options.batch == "goodput":
        from dl2d.policy.elastic.goodput import with_goodput_batch

        policy = with_goodput_batch(policy)
    return policy


def make_heuristic(name: str) -> Policy:
    """A heuristic by name (the guardrails' fallback, a teacher); ValueError for any other name."""
    heuristics = names(heuristic=True)
    if name not in heuristics:
        what = f"{name!r} is not a heuristic" if name in entries() else f"unknown policy {name!r}"
        raise ValueError(f"{what}; heuristics are {', '.join(heuristics)}")
    return build(name)
