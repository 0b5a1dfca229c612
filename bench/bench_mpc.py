"""Elastic's setting chosen slot by slot by simulating ahead: how much does that find beyond one setting a workload?

Why: on the Pollux workloads elastic's best efficiency threshold depends on how the jobs are configured (0.6 as
submitted, 0.8 tuned: bench/bench_styles.py), and a multi-node all-reduce job sharing a node with another is
slowed, which whole nodes avoid (``elastic_srtf``'s ``node_workers``). A scheduler could choose among these
rules every few slots by simulating each one ahead and keeping the best: model-predictive control over a small
set of hand-written rules. This bench measures what that finds, in two modes:

* ``oracle``: each rule is simulated on the true world (the trace's future arrivals, every job's hidden speed
  factor; noise off). No scheduler can do this; it bounds what choosing among these rules can find.
* ``believed``: each rule is simulated on what a scheduler knows at that slot: the jobs present with the epochs
  their users told and the speed factor measured while they ran (1 before), and as the future, the jobs of the
  last ``--lookback`` slots arriving again, shifted ahead by ``--lookback`` (and again, to cover the horizon).

A rule's cost is the job-slots spent in the system over ``--horizon`` slots, plus, for the jobs left at its end,
(n + 1) / 2 x their work left (one-GPU seconds over the cluster's GPUs): the mean completion of n equal jobs
drained at full efficiency in order. The rule of lowest cost runs for the next ``--every`` slots. The real run
is the simulator as is (restarts, noise, shared-node slowdown), as every other today bench. Variants:
``E`` is elastic at efficiency E, ``En`` the same with whole nodes for multi-node jobs.

    python bench/bench_mpc.py [--mode oracle|believed] [--folders workloads,workloads-realistic]
        [--workloads 1-8] [--generated tuned,realistic --seeds 100-103 --loads 1,2]
        [--variants 0.6,0.8,0.7n,0.8n] [--horizon 180] [--every 10] [--lookback 180]
        [--workers 2] [--out FILE.jsonl] [--record FILE.npz]

``--generated`` runs generated Philly workloads of those styles instead of the Pollux folders (160 jobs on
`t4-16`, bench/bench_styles.py's ``generated_trace``: elastic's tuning set by default). ``--record`` keeps, for
every choice, the cluster's state as dl2d.policy.elastic.chooser reads it and each rule's cost: what
bench/bench_chooser.py fits the learned chooser ``elastic-chooser`` to. ``--driver CHOOSER.json``: the real run
follows that chooser's choices, the costs still recorded (a DAgger round: labels on the learner's own states).
"""
from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import shlex
import sys
import time

import numpy as np

from dl2d.policy.elastic.srtf import EFFICIENCY
from dl2d.policy.baselines.heuristics import remaining_time_estimate
from dl2d.sim import engine as E
from dl2d.sim.trace import Trace, from_workload
from dl2d.policy.elastic.chooser import Chooser, state_features
from dl2d.sim.worlds import world
from dl2d.workload import philly
from dl2d.workload.speed import speed_table
from dl2d.workload.workloads import FOLDERS, WORKLOADS, packaged_workload

from bench_styles import generated_trace, numbers, variant
from jsonl_rows import Rows
from bench_today import MAX_SLOTS

MODES = ("oracle", "believed")
#: the SimState columns that have one row per trace job
JOB_COLUMNS = ("epochs_done", "finish_time", "slots_run", "workers", "ps", "restart_debt", "worker_servers",
               "ps_servers", "speed_factors")


def rollout_cost(trace: Trace, state: E.SimState, scheduler, cfg, table, horizon: int) -> float:
    """Job-slots in the system over ``horizon`` slots of ``scheduler`` from ``state``, plus the jobs left's
    estimated rest (module docstring)."""
    rng = np.random.default_rng(0)  # unused with the noise off; step takes one
    cost = 0.0
    for _ in range(horizon):
        if state.done():
            return cost
        state, _, _ = E.run_slot(trace, state, scheduler, cfg, rng, table)
        cost += len(state.active(trace))
    view = E.view_of(trace, state, cfg)
    if len(view):
        work = float(np.sum(remaining_time_estimate(view))) / cfg.slot_seconds
        cost += (len(view) + 1) / 2 * work / cfg.cluster.gpus
    return cost


def _rows(trace: Trace, idx: np.ndarray, arrival: np.ndarray, factor: np.ndarray) -> dict:
    """Trace columns of jobs ``idx`` with these arrivals and speed factors, their true epochs the told ones."""
    return dict(arrival_slot=arrival, type_idx=trace.type_idx[idx], est_epochs=trace.est_epochs[idx],
                true_epochs=trace.est_epochs[idx], speed_factor=factor, batch_size=trace.batch_size[idx],
                requested=trace.requested[idx], site_class=trace.site_class[idx])


def believed_world(trace: Trace, state: E.SimState, lookback: int, horizon: int) -> tuple[Trace, E.SimState]:
    """(trace, state) of what a scheduler knows at ``state.slot`` (module docstring): the jobs arrived so far,
    then the last ``lookback`` slots' arrivals again every ``lookback`` slots past the horizon's end."""
    now = state.slot
    seen = int(np.searchsorted(trace.arrival_slot, now, side="right"))  # sorted by arrival: a prefix
    measured = E.measured_speed_factor(state.speed_factors[:seen])
    cols = _rows(trace, np.arange(seen), trace.arrival_slot[:seen], np.where(np.isnan(measured), 1.0, measured))
    recent = np.flatnonzero(trace.arrival_slot[:seen] > now - lookback)
    copies = [(recent, trace.arrival_slot[recent] + k * lookback)
              for k in range(1, horizon // lookback + 2)] if len(recent) else []
    if copies:
        idx = np.concatenate([c[0] for c in copies])
        arrival = np.concatenate([c[1] for c in copies])
        order = np.argsort(arrival, kind="stable")
        more = _rows(trace, idx[order], arrival[order], np.ones(len(idx)))
        cols = {k: np.concatenate([cols[k], more[k]]) for k in cols}
    fresh = E.SimState.initial(len(cols["arrival_slot"]) - seen)

    def joined(a, b):
        return tuple(a[:seen]) + tuple(b) if isinstance(a, tuple) else np.concatenate([a[:seen], b])

    return Trace(config=trace.config, **cols), dataclasses.replace(
        state, **{c: joined(getattr(state, c), getattr(fresh, c)) for c in JOB_COLUMNS})


def run_mpc(trace: Trace, schedulers: list, cfg, seed: int, mode: str, horizon: int, every: int,
            lookback: int, record: list | None = None, driver=None) -> tuple[float, list[int]]:
    """(average JCT in hours, slots each scheduler ran) of the real run, choosing every ``every`` slots; each
    choice's (state features, costs) appended to ``record`` when given. ``driver``: a
    dl2d.policy.elastic.chooser.Chooser whose choice the real run follows instead (the costs are still computed
    and recorded: DAgger's labels on the learner's own states)."""
    plan_cfg = dataclasses.replace(cfg, slot_noise=0.0)
    table = speed_table(cfg.speed_model)
    rng = np.random.default_rng(seed)  # the real run's noise, drawn as engine.run draws it
    state = dataclasses.replace(E.SimState.initial(len(trace)), slot=int(trace.arrival_slot.min()))
    chosen, slots, counts = 0, 0, [0] * len(schedulers)
    while not state.done():
        if slots > cfg.max_slots:
            raise RuntimeError(f"the run did not finish within {cfg.max_slots} slots")
        view = E.view_of(trace, state, cfg)
        if slots % every == 0 and len(view):
            model, start = (trace, state) if mode == "oracle" else believed_world(trace, state, lookback, horizon)
            costs = [rollout_cost(model, start, s, plan_cfg, table, horizon) for s in schedulers]
            chosen = int(np.argmin(costs)) if driver is None else driver.choose(view)
            if record is not None:
                record.append((state_features(view), np.array(costs)))
        counts[chosen] += 1
        state, _, _ = E.step(trace, state, E.decide(schedulers[chosen], view), cfg, rng, table, view)
        slots += 1
    jct = state.finish_time - trace.arrival_slot
    return float(np.mean(jct)) * cfg.slot_seconds / 3600, counts


def workload_trace(folder: str, k: int, cfg) -> Trace:
    """A Pollux workload (``folder``, number k: trace seed k), or a generated one (``folder`` "generated STYLE
    LOAD", k its seed)."""
    if folder.startswith("generated"):
        _, style, load = folder.split()
        return generated_trace(style, float(load), k, cfg.slot_seconds)
    return from_workload(packaged_workload(k, folder), cfg.slot_seconds, seed=k)


def one(job) -> dict:
    folder, k, names, mode, horizon, every, lookback, recording, driver = job
    cfg = world("today").sim_config("t4-16", max_slots=MAX_SLOTS)
    trace = workload_trace(folder, k, cfg)
    schedulers = [variant(n, cfg) for n in names]
    row = {"folder": folder, "workload": k}
    t0 = time.perf_counter()
    for n, s in zip(names, schedulers):
        row[n] = round(E.run(trace, s, cfg, seed=k).avg_jct_hours, 4)
    record = [] if recording else None
    driver = None if driver is None else Chooser.load(driver)
    if driver is not None and driver.rules != tuple(names):
        raise ValueError(f"--driver chooses among {driver.rules}, --variants are {tuple(names)}")
    jct, counts = run_mpc(trace, schedulers, cfg, k, mode, horizon, every, lookback, record, driver)
    row.update({"mpc": round(jct, 4), "slots_chosen": dict(zip(names, counts)),
                "seconds": round(time.perf_counter() - t0, 1)})
    if record is not None:
        row["_record"] = record
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", default="believed", help=f"one of {', '.join(MODES)}")
    ap.add_argument("--folders", default="workloads,workloads-realistic")
    ap.add_argument("--workloads", default="1-8")
    ap.add_argument("--generated", default="", help="styles of generated workloads to run instead (tuned,realistic)")
    ap.add_argument("--seeds", default="100-103", help="--generated: the workloads' seeds")
    ap.add_argument("--loads", default="1,2", help="--generated: the workloads' loads")
    ap.add_argument("--record", default=None, help="keep every choice's state features and rule costs here (.npz)")
    ap.add_argument("--driver", default=None, help="a rule chooser (JSON) the real run follows instead (DAgger)")
    ap.add_argument("--variants", default="0.6,0.8,0.7n,0.8n", help="elastic's efficiencies; n: whole nodes")
    ap.add_argument("--horizon", type=int, default=180, help="slots each rule is simulated ahead")
    ap.add_argument("--every", type=int, default=10, help="slots between two choices")
    ap.add_argument("--lookback", type=int, default=180, help="believed: the past slots whose arrivals repeat")
    ap.add_argument("--workers", type=int, default=2, help="processes, one workload each")
    ap.add_argument("--out", default=None, help="also write the JSON lines here")
    args = ap.parse_args()
    if args.mode not in MODES:
        ap.error(f"--mode: {args.mode!r} is not one of {', '.join(MODES)}")
    if args.generated:
        styles = [g.strip() for g in args.generated.split(",") if g.strip()]
        if not styles or any(g not in philly.STYLES for g in styles):
            ap.error(f"--generated: each must be one of {', '.join(philly.STYLES)}, got {args.generated!r}")
        loads, seeds = numbers(args.loads, float, "loads", ap), numbers(args.seeds, int, "seeds", ap)
        if not loads or any(not 0 < x <= 10 for x in loads) or not seeds:
            ap.error("--loads: numbers in (0, 10], and --seeds: at least one seed")
        runs = [(f"generated {g} {x:g}", k) for g in styles for x in loads for k in seeds]
    else:
        folders = [f.strip() for f in args.folders.split(",") if f.strip()]
        if not folders or any(f not in FOLDERS for f in folders):
            ap.error(f"--folders: each must be one of {', '.join(FOLDERS)}, got {args.folders!r}")
        workloads = numbers(args.workloads, int, "workloads", ap)
        if not workloads or any(k not in WORKLOADS for k in workloads):
            ap.error(f"--workloads: each must be one of {WORKLOADS[0]}-{WORKLOADS[-1]}, got {args.workloads!r}")
        runs = [(f, k) for f in folders for k in workloads]
    if args.record is not None and not args.record.endswith(".npz"):
        ap.error(f"--record: {args.record!r} must end in .npz")
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    cfg = world("today").sim_config("t4-16", max_slots=MAX_SLOTS)  # the one each worker process makes again
    try:
        for n in names:
            variant(n, cfg)
    except ValueError as e:
        ap.error(f"--variants: {e} (each an efficiency, optionally followed by n)")
    if len(names) < 2:
        ap.error("--variants: at least two rules to choose between")
    for flag in ("horizon", "every", "lookback", "workers"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag} must be at least 1")
    head = {"command": "python " + shlex.join(["bench/bench_mpc.py", *sys.argv[1:]]), "mode": args.mode,
            "horizon": args.horizon, "every": args.every, "lookback": args.lookback, "elastic_default": EFFICIENCY,
            "driver": args.driver}
    if args.driver is not None:
        try:
            if Chooser.load(args.driver).rules != tuple(names):
                ap.error(f"--driver: {args.driver} chooses among other rules than --variants")
        except ValueError as e:
            ap.error(f"--driver: {e}")
    jobs = [(f, k, names, args.mode, args.horizon, args.every, args.lookback, args.record is not None, args.driver)
            for f, k in runs]
    records = []
    with Rows(args.out) as out, multiprocessing.Pool(min(args.workers, len(jobs))) as pool:
        out.add(head)
        rows = []
        for row in pool.imap(one, jobs):
            rec = row.pop("_record", None)
            if rec is not None:
                records.append((row["folder"], row["workload"], rec))
            rows.append(out.add(row))
        for f in dict.fromkeys(r["folder"] for r in rows):
            mine = [r for r in rows if r["folder"] == f]
            out.add({"folder": f, "mean": {n: round(float(np.mean([r[n] for r in mine])), 4) for n in names + ["mpc"]}})
    if args.record is not None:
        x = np.array([fx for _, _, rec in records for fx, _ in rec])
        costs = np.array([c for _, _, rec in records for _, c in rec])
        run = np.array([f"{f}/{k}" for f, k, rec in records for _ in rec])
        np.savez_compressed(args.record, x=x, costs=costs, run=run, rules=np.array(names),
                            command=np.array(head["command"]), mode=np.array(args.mode))


if __name__ == "__main__":
    main()
