"""The advice report: what the configured policy would have done in advise mode, against what ran.

In advise mode (docs/daemon.md) every decision row carries ``advice``: per job the size the policy advised and
the speed model's epochs/s at that size and at the size that ran. :func:`compare_advice` integrates both
speeds over the slots of each job's life into two predicted completion times by the same model, so their
difference is the policy's choice and not the model's error. It is a first-order estimate: each job's
advised speed is applied to the slots it actually lived through; how the advised sizes would have changed
the other jobs' queueing is not re-simulated (for that, run `dl2ctl sim` on the same trace).

:func:`compare_advice` is pure; :func:`advice_report` reads the rows.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from dl2d.db.models import Decision, Job, Slot

NAME = "advice"
DESCRIPTION = ("advise mode: each job's predicted JCT under what ran and under the policy's advice (same speed "
               "model; the others' queueing not re-simulated)")
COLUMNS = ["job_id", "name", "owner", "policy", "slots", "slots_advised_other", "observed_jct_h", "ran_jct_h",
           "advised_jct_h", "change_pct"]


@dataclass(frozen=True)
class AdvisedSlot:
    slot_id: int
    started_at: datetime
    ended_at: datetime
    policy: str
    jobs: Mapping[int, tuple[int, int, float, float]]  # job id -> (advised workers, ps, advised epochs/s, ran epochs/s)


@dataclass(frozen=True)
class JobLife:
    job_id: int
    name: str
    owner: str
    submitted_at: datetime
    total_epochs: float
    finished_at: datetime | None
    sizes: Mapping[int, tuple[int, int]]  # slot id -> (workers, ps) that ran
    ran_before: bool = False  # it ran in a slot without advice (its progress when advice began is unknown)


def _finish(slots: Sequence[AdvisedSlot], job_id: int, total: float, which: int) -> datetime | None:
    """When the job would reach ``total`` epochs at the speeds of ``which`` (2: advised, 3: ran), from its first
    advised slot; past the last slot, at the last slot's speed. None: never (no speed at the end)."""
    done, last_speed, last_end = 0.0, 0.0, None
    for s in slots:
        entry = s.jobs.get(job_id)
        if entry is None:
            continue
        speed, length = float(entry[which]), (s.ended_at - s.started_at).total_seconds()
        if speed > 0 and done + speed * length >= total:
            return s.started_at + timedelta(seconds=(total - done) / speed)
        done += speed * length
        last_speed, last_end = speed, s.ended_at
    if last_speed > 0 and last_end is not None:
        return last_end + timedelta(seconds=(total - done) / last_speed)
    return None


def compare_advice(slots: Sequence[AdvisedSlot], jobs: Iterable[JobLife]) -> list[dict[str, Any]]:
    """One row per job advised from its start (see the module doc), then an ``all`` row of the means over the jobs
    both predictions finish. A job that ran before advice began is left out: its progress then is unknown."""
    rows: list[dict[str, Any]] = []
    for job in jobs:
        mine = [s for s in slots if job.job_id in s.jobs]
        if not mine or job.ran_before:
            continue
        hours = lambda t: None if t is None else round((t - job.submitted_at).total_seconds() / 3600, 4)  # noqa: E731
        ran = hours(_finish(slots, job.job_id, job.total_epochs, 3))
        adv = hours(_finish(slots, job.job_id, job.total_epochs, 2))
        other = sum(1 for s in mine if tuple(s.jobs[job.job_id][:2]) != tuple(job.sizes.get(s.slot_id, (-1, -1))))
        rows.append({"job_id": job.job_id, "name": job.name, "owner": job.owner, "policy": mine[-1].policy,
                     "slots": len(mine), "slots_advised_other": other,
                     "observed_jct_h": hours(job.finished_at) if job.finished_at else None,
                     "ran_jct_h": ran, "advised_jct_h": adv,
                     "change_pct": round(100 * (adv - ran) / ran, 1) if ran and adv is not None else None})
    both = [r for r in rows if r["ran_jct_h"] is not None and r["advised_jct_h"] is not None]
    if both:
        ran_mean = sum(r["ran_jct_h"] for r in both) / len(both)
        adv_mean = sum(r["advised_jct_h"] for r in both) / len(both)
        obs = [r["observed_jct_h"] for r in both if r["observed_jct_h"] is not None]
        rows.append({"job_id": None, "name": "all", "owner": None, "policy": rows[-1]["policy"], "slots": None,
                     "slots_advised_other": sum(r["slots_advised_other"] for r in rows),
                     "observed_jct_h": round(sum(obs) / len(obs), 4) if obs else None,
                     "ran_jct_h": round(ran_mean, 4), "advised_jct_h": round(adv_mean, 4),
                     "change_pct": round(100 * (adv_mean - ran_mean) / ran_mean, 1) if ran_mean else None})
    return rows


def advice_report(session: Session, start: datetime | None = None, end: datetime | None = None
                  ) -> list[dict[str, Any]]:
    """:func:`compare_advice` over every closed slot with advice in the database; with a window [start, end)
    (either bound None: none), only the jobs that finished in it."""
    from dl2d.db.models import Allocation

    q = (select(Slot.id, Slot.started_at, Slot.ended_at, Decision.advice).join(Decision, Decision.slot_id == Slot.id)
         .where(Decision.advice.is_not(None), Slot.ended_at.is_not(None)).order_by(Slot.number))
    slots: list[AdvisedSlot] = []
    for slot_id, started, ended, advice in session.execute(q):
        if not isinstance(advice, dict):
            continue
        entries = {int(e[0]): (int(e[1]), int(e[2]), float(e[3]), float(e[4])) for e in advice.get("jobs", [])}
        slots.append(AdvisedSlot(slot_id, started, ended, str(advice.get("policy", "?")), entries))
    if not slots:
        return []
    job_ids = sorted({j for s in slots for j in s.jobs})
    ran: dict[int, dict[int, tuple[int, int]]] = {}
    q = (select(Allocation.slot_id, Allocation.job_id, Allocation.workers, Allocation.ps)
         .join(Decision, Decision.slot_id == Allocation.slot_id).where(Decision.advice.is_not(None)))
    for sid, job_id, w, p in session.execute(q):
        ran.setdefault(job_id, {})[sid] = (w, p)
    q = (select(Allocation.job_id).distinct().join(Decision, Decision.slot_id == Allocation.slot_id)
         .where(Decision.advice.is_(None), Allocation.workers > 0))
    ran_before = set(session.scalars(q))
    finished = ([Job.finished_at >= start] if start is not None else []) + \
        ([Job.finished_at < end] if end is not None else [])
    lives = [JobLife(j.id, j.name, j.owner, j.submitted_at, float(j.total_epochs), j.finished_at, ran.get(j.id, {}),
                     j.id in ran_before)
             for k in range(0, len(job_ids), 500)  # ids per IN (...), well within every backend's limit
             for j in session.scalars(select(Job).where(Job.id.in_(job_ids[k:k + 500]), *finished).order_by(Job.id))]
    return compare_advice(slots, lives)
