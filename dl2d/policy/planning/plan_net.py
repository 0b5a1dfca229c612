"""The target-size network that reads the planner's plan (teacher ``lp-plan``), registered as ``dl2-plan-checked``.

Why: on `testbed` the network distilled from the planner came within 0.5 % of it, and the planner is 3.7 % above
the LP bound; the lookahead over the planner's rounding (dl2d.policy.planning.lp_lookahead) is 2.8 %, but every network
distilled from it lost its gain, because departing from the planner had to be learned together with the planner
itself, whose 12-14 % of disagreements swamped the departures (docs/BENCHMARKS.md, "Tried and not kept"). Once the
speed table is learned from observation (dl2d.policy.planning.learned_speeds) the planner on it is something a scheduler
can run, so the network may read its plan: each job's planned pair as its teacher's (one-hot, raised by
``prior``: where the network learned nothing it does what the planner does), the plan's columns
(dl2d.policy.target.policy.PLAN_COLUMNS) and a relative head, whose logits are moves of the planner's pair ("one PS
more", "start it at one worker": dl2d.policy.target.policy.RELATIVE_MOVES). It learns only when to depart, from the
lookahead's choices on training traces (:func:`collect`, :func:`start_from`; plan_distill.fit with a weight on
the departures), and decides with one program solve a slot (30 ms at the median `testbed` slot; the planner's
cost, not the network's, grows with the jobs: dl2d.policy.planning.lp_plan). On `testbed`'s held-out traces it is 3.10 %
above the LP bound unchecked (``dl2-plan``, retired), the planner 3.73 %, the lookahead 2.78 % (docs/BENCHMARKS.md).

Registered as ``dl2-plan-checked``, each departure the network proposes is kept only where 3 slots simulated on
the learned table (lp_lookahead.horizon_value) say it helps (PlanNetPolicy's ``check``): what the lookahead's
departures depend on, the next few slots, is what the plan's columns do not show, and more labels or a DAgger
round did not teach it. On `testbed`'s held-out traces 2.82 % above the bound, within 3 % of it
(docs/BENCHMARKS.md), at a program solve a slot plus three per departure tried.

The network's speed curves are the learned table's too (lp_plan.measured_view), as the planner's.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Callable

import numpy as np

from dl2d.core.contract import SlotView
from dl2d.policy.planning import learned_speeds as LS
from dl2d.policy.planning import lp_plan as LP
from dl2d.policy.planning.lp_lookahead import REGISTERED as LOOKAHEAD, horizon_value
from dl2d.policy.registry import PolicyOptions

log = logging.getLogger("dl2d")

#: The planner's program as the registered lookahead's: the bound's in-bucket term, with its tangent lines
#: (dl2d.policy.planning.lp_plan).
IN_BUCKET = LOOKAHEAD["in_bucket"]
#: The shipped checkpoint (docs/BENCHMARKS.md says how it was made and how it scores).
PRETRAINED = Path(__file__).with_name("pretrained") / "plan-dl2.msgpack"


def plan_obs(cfg, view: SlotView, table: np.ndarray, in_bucket: int = IN_BUCKET) -> tuple[dict, object]:
    """(the network's observation of ``view``, the planner's allocation): dl2d.policy.target.view.view_obs on the
    view with the learned ``table``'s speeds (lp_plan.measured_view), and the plan of the program solved once: each
    job's pair in the planner's allocation (``plan_pair``, on ``cfg``'s levels) and the PLAN_COLUMNS' keys."""
    from dl2d.policy.target import view as TV
    from dl2d.policy.planning.plan_distill import pair_labels

    mv = LP.measured_view(view, table)
    obs = TV.view_obs(cfg, mv)
    if not len(view):
        return obs, LP.lp_plan(mv)
    p = LP.plan(mv, in_bucket=in_bucket)
    alloc = LP.first_slot(mv, p)
    order, _ = LP.own_rounding(p)
    pos = np.zeros(len(view), np.float32)
    pos[order] = np.arange(len(view))
    obs.update(plan_pair=pair_labels(cfg, alloc.workers, alloc.ps, view.allreduce), plan_pos=pos,
               plan_now=(p.now >= 0).astype(np.float32),
               plan_share=np.array([float(np.sum(s)) for s in p.first_share], np.float32),
               plan_alpha=np.minimum(p.alpha / view.slot_seconds, 1e4).astype(np.float32))
    return obs, alloc


def _check(cfg) -> None:
    if not cfg.reads_plan:
        raise ValueError(f"a network that reads the plan has teacher lp-plan, this one {cfg.teacher!r}")


class PlanNetPolicy:
    """The network on a view (dl2d.policy.target.view.TargetPolicy's decision and fill) with its observation from
    :func:`plan_obs`. ``departures``/``jobs``: how many job-slots it gave a pair other than the planner's.

    With ``check`` > 0 (``dl2-plan-checked``) a departure is kept only where the model agrees: starting from the
    planner's pairs, each job the network departs on takes the network's pair in turn, kept where the fill's
    :func:`dl2d.policy.planning.lp_lookahead.horizon_value` (``check`` slots simulated on the learned table, then the
    program's bound) is lower than without it (``kept``/``rejected`` count them). Why: the network departs on
    6-7 % of the job-slots, and some of those departures cost more than they gain; the lookahead's own search
    scores tens of candidates a slot, this scores one per departure (3 program solves each at ``check`` 3)."""

    def __init__(self, cfg, params, table: np.ndarray, name: str = "dl2-plan", kinds=("ps", "allreduce"),
                 check: int = 0):
        from dl2d.policy.target.view import TargetPolicy

        _check(cfg)
        if check < 0:
            raise ValueError(f"check must be at least 0 slots, got {check}")
        self.table, self.name, self.check = table, name, int(check)
        self.net = TargetPolicy(cfg, params, name, kinds)
        self.departures = self.jobs = self.kept = self.rejected = 0

    def __call__(self, view: SlotView):
        obs, _ = plan_obs(self.net.cfg, view, self.table)
        if not len(view):
            return self.net.place(view, np.zeros(0, int), obs)
        action, _ = self.net.actions(view, obs)
        if self.check:
            action = self.checked(view, obs, action)
        self.departures += int(np.sum(action != obs["plan_pair"]))
        self.jobs += len(view)
        return self.net.place(view, action, obs)

    def checked(self, view: SlotView, obs: dict, action: np.ndarray) -> np.ndarray:
        """The planner's pairs with those of ``action``'s departures that lower the horizon value, tried in job
        order, each on top of those kept before it."""
        plan = np.asarray(obs["plan_pair"])
        departs = np.flatnonzero(action != plan)
        if not len(departs):
            return action
        mv = LP.measured_view(view, self.table)

        def value(pairs):
            return horizon_value(mv, self.net.place(view, pairs, obs), self.check, IN_BUCKET)

        out, best = plan.copy(), value(plan)
        for j in departs:
            trial = out.copy()
            trial[j] = action[j]
            v = value(trial)
            if v < best:
                out, best = trial, v
                self.kept += 1
            else:
                self.rejected += 1
        return out

    def applied(self, view, allocation, overridden: bool) -> None:
        pass

    def observe(self, reward: float) -> None:
        pass


# ------------------------------------------------------------------------------------------ training

def start_from(tcfg, params, prior: float):
    """(config, params) of a network that reads the plan, from a trained target network ``params`` of ``tcfg``
    (its trunk: each feature column's weights where the new network has that column, 0 for the plan's columns),
    with the pair logits and the relative head at 0: with ``prior`` > 0 it starts as the planner exactly."""
    import jax
    import jax.numpy as jnp

    from dl2d.policy.target import policy as T
    from dl2d.policy.planning.plan_distill import embed_columns

    new = dataclasses.replace(tcfg, teacher="lp-plan", prior=float(prior))
    out = jax.tree_util.tree_map(np.asarray, T.init_params(new, jax.random.PRNGKey(0)))
    for net in ("actor", "critic"):
        for layer in params[net]:
            out[net][layer] = {k: np.asarray(v) for k, v in params[net][layer].items()}
        out[net]["embed"]["kernel"] = embed_columns(tcfg, new, params[net]["embed"]["kernel"])
    out["value"] = {k: np.asarray(v) for k, v in params["value"].items()}
    for head in ("logits", "relative"):
        out[head] = {k: np.zeros_like(v) for k, v in out[head].items()}
    return new, jax.tree_util.tree_map(jnp.asarray, out)


class Recorder:
    """A Policy for one simulator run, as plan_distill's Recorder with the plan: records every slot's features
    (the network's, ``tcfg``, from :func:`plan_obs`) and the ``teacher``'s pairs (the lookahead), and carries out
    the teacher's allocation or, given a ``driver`` (a PlanNetPolicy: DAgger), the driver's, so that the labels
    cover the states the network itself reaches."""

    name = "plan-net-recorder"

    def __init__(self, tcfg, teacher: Callable, table: np.ndarray, driver: Callable | None = None):
        _check(tcfg)
        self.tcfg, self.teacher, self.table, self.driver = tcfg, teacher, table, driver
        self.parts: list[tuple] = []

    def __call__(self, view: SlotView):
        from dl2d.policy.planning.plan_distill import slot_sample

        alloc = self.teacher(view)
        if not len(view):
            return alloc
        self.parts.append(slot_sample(self.tcfg, plan_obs(self.tcfg, view, self.table)[0], view, alloc))
        return alloc if self.driver is None else self.driver(view)

    def applied(self, view, allocation, overridden: bool) -> None:
        pass

    def observe(self, reward: float) -> None:
        pass


def collect(tcfg, cfg, trace, seed: int, table: np.ndarray, driver: Callable | None = None):
    """(Samples of one simulator run of ``trace`` labelled by the lookahead on ``table``
    (lp_lookahead.REGISTERED) and driven by it or by ``driver`` (see Recorder), the run's average JCT in slots,
    seconds taken)."""
    from dl2d.policy.planning.lp_lookahead import REGISTERED, Lookahead
    from dl2d.policy.planning.plan_distill import Samples
    from dl2d.sim import engine as E

    t0 = time.perf_counter()
    rec = Recorder(tcfg, Lookahead(table, seed=seed, **REGISTERED), table, driver)
    res = E.run(trace, rec, cfg, seed=seed)
    return Samples.stack(rec.parts), float(res.jct_slots.mean()), time.perf_counter() - t0


# ------------------------------------------------------------------------------------------ the registry

def load(path=None, table_path=None, check: int = 0) -> PlanNetPolicy:
    """The shipped network (or the checkpoint at ``path``) on the package's learned table (or ``table_path``'s),
    refused (ValueError naming both) where the checkpoint was trained on another table than the one given;
    ``check``: PlanNetPolicy's."""
    from dl2d.policy.checkpoint import load_target
    from dl2d.policy.target.entry import trained_kinds

    path = Path(path or PRETRAINED)
    ckpt = load_target(path)
    table, _, meta = LS.load(LS.SHIPPED if table_path is None else table_path)
    want = ckpt.meta.get("table_sha256")
    if want and want != meta["sha256"]:
        raise ValueError(f"{path} was trained on the speed table {want[:12]}, {table_path or LS.SHIPPED} is "
                         f"{meta['sha256'][:12]}: give the table it was trained on")
    return PlanNetPolicy(ckpt.config, ckpt.params, table, name="dl2-plan-checked" if check else "dl2-plan",
                         kinds=trained_kinds(ckpt.meta), check=check)


#: The check's horizon of ``dl2-plan-checked``: the registered lookahead's.
CHECK_SLOTS = LOOKAHEAD["horizon"]


#: Why a planning policy refuses another world: its speed table and its network are the DL2 world's.
DL2_WORLD_ONLY = ("{name} plans the DL2 paper's world of PS jobs on a speed table learned there; it runs with "
                  "world = \"dl2\" (dl2ctl sim --world dl2; the daemon's policy.world)")


def build_checked(options: PolicyOptions):
    """``dl2-plan-checked``: the shipped (or given) network, each departure checked over :data:`CHECK_SLOTS`."""
    from dl2d.policy.baselines.optimus import FittedOptimus

    path = options.checkpoint or str(PRETRAINED)
    rule = load(path, check=CHECK_SLOTS)
    log.info("policy: %s from %s", rule.name, path)
    return FittedOptimus(rule=rule, name=rule.name)


def check(options: PolicyOptions) -> list[tuple[str, str]]:
    if options.world != "dl2":
        return [("world", DL2_WORLD_ONLY.format(name="dl2-plan-checked"))]
    if not options.checkpoint and not PRETRAINED.exists():
        return [("checkpoint", "policy dl2-plan-checked ships no pretrained network: give one "
                 "(python bench/bench_plan_net.py --out FILE)")]
    return []
