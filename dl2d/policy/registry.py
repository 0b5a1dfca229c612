"""One registry of scheduling policies: the daemon, `dl2ctl sim`, `dl2ctl train` and the benchmarks build every
policy through it.

A :class:`Policy` is a :class:`dl2d.core.contract.Scheduler` (calling it decides a slot: a view in, an
allocation out, so every policy runs in the simulator) that also hears what happened to its decision
(:meth:`Policy.applied`: carried out, or overridden by the daemon's guardrails) and the slot's reward
(:meth:`Policy.observe`). A policy that learns online also has a ``version`` and ``save`` (:class:`Learner`).

Each name maps to a :class:`PolicyEntry`: a factory from :class:`PolicyOptions`, the checks of those options
(each problem names the option), and what kind of policy it is. A new policy is one module that calls
:func:`register` (and one line in :data:`MODULES` so it is imported); the Kubernetes scheduler's plugin
registry is the model: names to factories, the wiring knows no policy by name.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field
from typing import Callable, Protocol, runtime_checkable

from dl2d.core.contract import Allocation, SlotView

#: Modules that register policies (imported on first use of the registry).
MODULES = ("dl2d.policy.heuristics", "dl2d.policy.optimus", "dl2d.policy.dl2", "dl2d.policy.chic",
           "dl2d.policy.dual_agent", "dl2d.policy.oracle", "dl2d.policy.slurm_fifo", "dl2d.policy.tiresias",
           "dl2d.policy.elastic", "dl2d.policy.lp_plan", "dl2d.policy.lp_lookahead",
           "dl2d.policy.dl2_target", "dl2d.policy.plan_net", "dl2d.policy.rule_chooser")
#: How tasks are placed on servers: the policy's own placement, or DLTAP re-placing the policy's tasks.
PLACEMENTS = ("balance", "dltap")


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


#: Which jobs an online learner samples a pair for (dl2d.policy.target_online): "every" job, or only those
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
    fallback: str = "drf"  # the heuristic an online learner is measured against (dl2d.policy.target_online)
    online_window: int = 8  # slots per online update, and per check of the revert rule (dl2-target)
    revert_margin: float = 0.2  # revert when a window scores below 1 - margin of the fallback's (dl2-target)
    online_temperature: float = 0.5  # dl2-target online: samples from softmax(logits / this); < 1 explores less
    online_explore: str = "every"  # dl2-target online: which jobs sample ("every"; "resizing": those that restart anyway)
    #: a job of more workers than a node holds gets whole nodes (8, 12, ... on nodes of 4 GPUs), as sites give
    #: multi-node jobs: none then shares a node with another (policies with "whole_nodes" in their options)
    whole_nodes: bool = False


def no_problems(options: PolicyOptions) -> list[tuple[str, str]]:
    return []


@dataclass(frozen=True)
class PolicyEntry:
    name: str
    summary: str
    build: Callable[[PolicyOptions], Policy]
    check: Callable[[PolicyOptions], list[tuple[str, str]]] = no_problems  # [(option, problem)]
    heuristic: bool = False  # a hand-written rule: a guardrail fallback and a teacher for supervised warm-up
    learned: bool = False  # trained parameters (a checkpoint) decide
    trained_by: str = ""  # the command that trains its checkpoint
    online: bool = False  # can learn online from the daemon's rewards
    daemon: bool = True  # fit for a real cluster (the oracle knows the simulator's truth: not)
    options: tuple[str, ...] = field(default=())  # the PolicyOptions fields it reads


_ENTRIES: dict[str, PolicyEntry] = {}
_MODULE_RANK: dict[str, int] = {}  # policy name -> index in MODULES of the module that registered it
_loaded = False


def register(entry: PolicyEntry) -> PolicyEntry:
    """Add a policy; a second entry under the same name is a bug (ValueError)."""
    if entry.name in _ENTRIES and _ENTRIES[entry.name] is not entry:
        raise ValueError(f"policy {entry.name!r} is registered twice")
    module = sys._getframe(1).f_globals.get("__name__", "")
    _ENTRIES[entry.name] = entry
    _MODULE_RANK[entry.name] = MODULES.index(module) if module in MODULES else len(MODULES)
    return entry


def _load() -> None:
    global _loaded
    if not _loaded:
        for module in MODULES:
            importlib.import_module(module)
        _loaded = True


def entries() -> dict[str, PolicyEntry]:
    """Every registered policy by name: in the order of :data:`MODULES`, then of registration within a module
    (so listings do not depend on which policy module some caller happened to import first)."""
    _load()
    return dict(sorted(_ENTRIES.items(), key=lambda item: _MODULE_RANK[item[0]]))


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
    return list(entry.check(options))


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
    found = problems(name, options)
    if found:
        option, msg = found[0]
        raise PolicyBuildError(f"policy {name}: {option}: {msg}")
    try:
        policy = get(name).build(options)
    except PolicyBuildError:
        raise
    except (OSError, ValueError, RuntimeError) as e:  # checkpoint errors and the like, never a traceback
        raise PolicyBuildError(f"policy {name}: {e}") from None
    if placement == "dltap":
        from dl2d.policy.dltap import with_dltap

        policy = with_dltap(policy, trim=trim)
    return policy


def make_heuristic(name: str) -> Policy:
    """A heuristic by name (the guardrails' fallback, a teacher); ValueError for any other name."""
    heuristics = names(heuristic=True)
    if name not in heuristics:
        what = f"{name!r} is not a heuristic" if name in entries() else f"unknown policy {name!r}"
        raise ValueError(f"{what}; heuristics are {', '.join(heuristics)}")
    return build(name)
