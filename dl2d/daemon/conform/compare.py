"""Two worlds' records of one trace, compared (pure): the share of job-slots both gave the same workers, the
first slot where they parted and why, and each world's starts, resizes, idle GPUs, JCTs and makespan.

A *job-slot* is a slot in which the job was in the system in either world (submitted, not yet finished); a
job not in a world's allocation of that slot has 0 workers there. A world's JCT of a job runs from the start of
its arrival slot to its finish (both worlds count from the same moment, though a real user's submission comes
a moment before that slot begins)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from dl2d.daemon.conservation import FLAG as BELOW_USE

#: Event kinds (dl2d.db.models.EventKind) of the resizes of a running job, by how they were carried out.
RESIZE_KINDS = ("hot_scale", "relaunch", "resize")


@dataclass
class WorldRecord:
    """What one world's database (and, for a real one, Slurm) recorded of a run, slots counted from its first."""

    world: str  # "real" or "twin"
    policy: str
    gpus: int  # the cluster's
    slots: int  # slots run
    alloc: dict[tuple[int, str], int]  # (slot, job) -> workers decided
    ran: dict[tuple[int, str], int]  # (slot, job) -> workers it ran with in the slot
    epochs: dict[tuple[int, str], float]  # (slot, job) -> epochs done by the end of the slot
    flags: dict[tuple[int, str], list[str]]  # (slot, job) -> the decision's flags (e.g. "pending: ...")
    events: list[tuple[int, str, str]]  # (slot, job, kind): start, hot_scale, relaunch, resize
    arrival: dict[str, int]  # job -> its arrival slot
    finish_s: dict[str, float]  # job -> seconds from the first slot's start to its finish
    jct_s: dict[str, float]  # job -> seconds from its arrival slot's start to its finish
    slot_s: float = 0.0
    #: real only: (slot, GPUs Slurm held for dl2d's jobs, GPUs dl2d counted in use) where Slurm held more
    over_held: list[tuple[int, int, int]] = field(default_factory=list)
    checked_slots: int = 0  # real only: slots at which Slurm's holding was compared with dl2d's
    #: slot -> seconds into it at which its starts and resizes were carried out (the median of its events')
    apply_at: dict[int, float] = field(default_factory=dict)
    #: (slot, job) -> seconds into the slot at which the job's start or resize was carried out
    job_apply_at: dict[tuple[int, str], float] = field(default_factory=dict)

    def applied_at(self, slot: int, job: str) -> float:
        return self.job_apply_at.get((slot, job), self.apply_at.get(slot, 0.0))

    def active(self, slot: int, job: str) -> bool:
        arr = self.arrival.get(job)
        if arr is None or slot < arr:
            return False
        fin = self.finish_s.get(job)
        return fin is None or slot * self.slot_s < fin

    def summary(self) -> dict[str, Any]:
        kinds: dict[str, int] = {k: 0 for k in RESIZE_KINDS}
        for _, _, kind in self.events:
            if kind in kinds:
                kinds[kind] += 1
        used = np.zeros(self.slots)
        for (slot, _), w in self.ran.items():
            if 0 <= slot < self.slots:
                used[slot] += w
        jct = np.array(list(self.jct_s.values()), float)
        below = self.below_use()
        return {"world": self.world, "policy": self.policy, "jobs": len(self.arrival), "finished": len(self.jct_s),
                "avg_jct_s": round(float(jct.mean()), 2) if len(jct) else None,
                "makespan_s": round(max(self.finish_s.values()), 2) if self.finish_s else None,
                "starts": sum(kind == "start" for _, _, kind in self.events), "resizes": kinds,
                "idle_gpu_slots": int(round(float((self.gpus - used).clip(0).sum()))), "slots": self.slots,
                "below_use_job_slots": sum(len(v) for v in below.values()),
                "below_use_longest_slots": max((longest_run(v) for v in below.values()), default=0)}

    def below_use(self) -> dict[str, list[int]]:
        """job -> the slots whose decision flagged it below what it could use (dl2d.daemon.conservation)."""
        out: dict[str, list[int]] = {}
        for (slot, job), flags in sorted(self.flags.items()):
            if any(f.startswith(BELOW_USE) for f in flags):
                out.setdefault(job, []).append(slot)
        return out


def longest_run(slots: Sequence[int]) -> int:
    """The most consecutive slots in ``slots`` (sorted)."""
    best = run = 0
    for i, s in enumerate(slots):
        run = run + 1 if i and s == slots[i - 1] + 1 else 1
        best = max(best, run)
    return best


def trained(rec: WorldRecord, slot: int, job: str) -> float:
    """Epochs ``job`` trained in ``slot``."""
    return rec.epochs.get((slot, job), 0.0) - rec.epochs.get((slot - 1, job), 0.0)


@dataclass(frozen=True)
class Costs:
    """What starting a job costs on the real cluster, in seconds of training lost beyond the moment the daemon
    carried the start out: a start on free nodes, a restart, and the wait of a start on nodes that a job stopped
    or restarted in the same slot is still leaving (Slurm's completing job, its next scheduling pass)."""

    start_s: float = 0.0
    restart_s: float = 0.0
    release_s: float = 0.0


def restart_costs(real: WorldRecord, speed: Mapping[str, Mapping[int, float]]) -> Costs:
    """:class:`Costs` from the real run: medians, over the starts (and restarts) after which a job trained without
    finishing or changing size, of the time from when in its slot the daemon applied the start to the end of the
    first slot it trained through half of, less the seconds its epochs took at its speed (``speed``: job ->
    workers -> epochs per second). A start after another job's stop or restart in the same slot counts toward
    ``release_s`` (beyond ``start_s``). 0 where no start shows one."""
    lost: dict[str, list[float]] = {"start": [], "relaunch": [], "release": []}
    leaving: dict[int, list[float]] = {}  # slot -> when in it jobs were stopped or restarted
    for slot, job, kind in real.events:
        if kind in ("relaunch", "resize"):
            leaving.setdefault(slot, []).append(real.applied_at(slot, job))
    changed = {(slot, job) for slot, job, _ in real.events}
    for slot, job, kind in real.events:
        workers = real.ran.get((slot, job), 0)
        rate = speed.get(job, {}).get(workers)
        if kind not in lost or not rate:
            continue
        at = real.applied_at(slot, job)
        gone = _start_lost(real, slot, job, workers, rate, at, changed)
        if gone is None:
            continue
        after_release = kind == "start" and any(t < at for t in leaving.get(slot, []))
        lost["release" if after_release else kind].append(gone)
    med = {k: float(np.median(v)) if v else None for k, v in lost.items()}
    start = med["start"] if med["start"] is not None else 0.0
    restart = med["relaunch"] if med["relaunch"] is not None else start
    release = max(med["release"] - start, 0.0) if med["release"] is not None else 0.0
    return Costs(start, restart, release)


def _start_lost(real: WorldRecord, slot: int, job: str, workers: int, rate: float, at: float,
                changed: set[tuple[int, str]], within: int = 20) -> float | None:
    """Seconds of training a start (or restart) of ``job`` at ``slot``, carried out ``at`` seconds into it, lost
    until the job trained through at least half a slot at ``rate``: the slots from its start to that one, less
    the time its epochs took. A start that outlasts its slot (a JAX job's processes importing and compiling)
    counts all of it. None where the job finished, changed size or was resized again before that."""
    done = real.finish_s.get(job)
    epochs = 0.0
    for k in range(slot, slot + within):
        if real.ran.get((k, job), 0) != workers or (k > slot and (k, job) in changed):
            return None
        if done is not None and done < (k + 1) * real.slot_s:
            return None
        got = trained(real, k, job)
        epochs += got
        if got >= 0.5 * rate * real.slot_s:
            return max((k + 1 - slot) * real.slot_s - at - epochs / rate, 0.0)
    return None


@dataclass(frozen=True)
class Divergence:
    slot: int
    job: str
    real: int
    twin: int
    cause: str


def _cause(real: WorldRecord, twin: WorldRecord, slot: int, job: str) -> str:
    """Why the worlds gave ``job`` different workers at ``slot``, from what differed just before."""
    if real.active(slot, job) != twin.active(slot, job):
        where = "real" if real.active(slot, job) else "twin"
        return f"the job is in the system only in the {where} world (an arrival or finish a slot apart)"
    pending = [f for f in real.flags.get((slot - 1, job), []) if f.startswith("pending: Slurm")]
    if pending:
        return f"Slurm held it: {pending[0]}"
    ran_apart = sorted(o for o in set(real.arrival) | set(twin.arrival)
                       if real.ran.get((slot - 1, o), 0) != twin.ran.get((slot - 1, o), 0))
    if ran_apart:
        o = job if job in ran_apart else ran_apart[0]
        why = [f for f in real.flags.get((slot, o), []) if f.startswith("pending: Slurm")]
        return (f"in slot {slot - 1} {o} ran with {real.ran.get((slot - 1, o), 0)} workers on Slurm, "
                f"{twin.ran.get((slot - 1, o), 0)} in the twin" + (f" ({why[0]})" if why else ""))
    worst, what = 0.0, ""
    for (s, other), e_r in real.epochs.items():
        if s != slot - 1:
            continue
        e_t = twin.epochs.get((s, other))
        if e_t is None:
            continue
        rel = abs(e_r - e_t) / max(abs(e_r), abs(e_t), 1e-12)  # of the further one: 100 % where one is 0
        if rel > worst:
            why = [f for f in real.flags.get((slot, other), []) if f.startswith("pending: Slurm")]
            worst, what = rel, (f"{other} had {e_r:.4g} epochs done on Slurm, {e_t:.4g} in the twin"
                                + (f"; {why[0]}" if why else ""))
    others = sorted(o for (s, o), w in real.alloc.items() if s == slot and twin.alloc.get((s, o), 0) != w)
    tail = f"; the slot's other differences: {', '.join(o for o in others if o != job)}" if len(others) > 1 else ""
    if worst > 0.02:
        return f"progress differed by {worst:.0%} ({what}){tail}"
    return f"the same jobs, sizes and progress (within 2%): the policy's other inputs differed{tail}"


def compare(real: WorldRecord, twin: WorldRecord) -> dict[str, Any]:
    """The side-by-side report of one policy's two runs (module docstring)."""
    jobs = sorted(set(real.arrival) | set(twin.arrival))
    slots = max(real.slots, twin.slots)
    same = total = 0
    divergences: list[Divergence] = []
    for slot in range(slots):
        for job in jobs:
            if not (real.active(slot, job) or twin.active(slot, job)):
                continue
            total += 1
            r, t = real.alloc.get((slot, job), 0), twin.alloc.get((slot, job), 0)
            if r == t:
                same += 1
            elif not divergences or divergences[-1].slot != slot:
                divergences.append(Divergence(slot, job, r, t, _cause(real, twin, slot, job)))
    per_job = {}
    for job in jobs:
        r, t = real.jct_s.get(job), twin.jct_s.get(job)
        per_job[job] = {"real_s": r, "twin_s": t,
                        "ratio": round(r / t, 3) if r is not None and t else None}
    rs, ts = real.summary(), twin.summary()
    jct_ratio = (rs["avg_jct_s"] / ts["avg_jct_s"]) if rs["avg_jct_s"] and ts["avg_jct_s"] else None
    return {"policy": real.policy, "job_slots": total, "same_allocation": same,
            "agreement": round(same / total, 4) if total else None,
            "avg_jct_ratio": round(jct_ratio, 4) if jct_ratio else None,
            "real": rs, "twin": ts, "jobs": per_job,
            "divergences": [d.__dict__ for d in divergences],
            "slurm_over_held": [list(x) for x in real.over_held], "slurm_checked_slots": real.checked_slots}


def ordering(reports: Sequence[Mapping[str, Any]], world: str) -> list[str]:
    """The policies by their average JCT in ``world`` ("real" or "twin"), best first."""
    return [r["policy"] for r in sorted(reports, key=lambda r: r[world]["avg_jct_s"] or float("inf"))]


def report_line(rep: Mapping[str, Any]) -> str:
    """One policy's comparison in a line, as ``dl2ctl conform`` and the bench print it."""
    r, t = rep["real"], rep["twin"]
    first = rep["divergences"][0] if rep.get("divergences") else None
    parted = f"; first divergence: slot {first['slot']}, {first['job']}: {first['cause']}" if first else ""
    return (f"{rep['policy']}: agreement {rep['agreement']:.1%} of {rep['job_slots']} job-slots; avg JCT real "
            f"{r['avg_jct_s']} s, twin {t['avg_jct_s']} s (x{rep['avg_jct_ratio']}); resizes real "
            f"{sum(r['resizes'].values())}, twin {sum(t['resizes'].values())}; slots Slurm held a GPU dl2d counted "
            f"free: {len(rep['slurm_over_held'])} of {rep['slurm_checked_slots']}; below what they could use beside idle "
            f"GPUs: real {r['below_use_job_slots']} job-slots (longest {r['below_use_longest_slots']}), twin "
            f"{t['below_use_job_slots']} ({t['below_use_longest_slots']}); costs {rep['costs']}{parted}")
