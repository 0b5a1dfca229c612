"""SQLAlchemy 2.0 typed ORM models of the dl2d database.

All timestamps are timezone-aware UTC (`UTCDateTime`): SQLite stores them as naive ISO strings, so the
type converts to UTC on the way in and re-attaches UTC on the way out. JSON columns use the generic
`sqlalchemy.JSON` (TEXT on SQLite, json on PostgreSQL). Enumerations are stored as VARCHAR with a CHECK
constraint (`native_enum=False`) so that adding a value later is a plain migration on both backends.

The schema itself is created by the Alembic migrations in `dl2d/db/migrations/`; a test checks that
these models and the migrated schema do not differ.
"""
from __future__ import annotations

import enum
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    DateTime,
    Enum,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from dl2d.core.jobs import IntentKind


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def row_id(obj: Any) -> int | None:
    """The id of a row, or the id itself: the repository functions take either."""
    return obj if obj is None or isinstance(obj, int) else obj.id


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend (naive input is taken as UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=timezone.utc)
        value = value.astimezone(timezone.utc)
        # SQLite has no time zones: store the naive UTC wall clock so that date functions work.
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {
        datetime: UTCDateTime(),
        dict[str, Any]: JSON(),
        list[Any]: JSON(),
    }


class JobState(str, enum.Enum):
    """A job's life: PENDING (no workers) <-> RUNNING (workers > 0), then one of the terminal states.

    A resize is applied within one tick, so no state is ever committed for "being resized" (migration 0003
    dropped the never-written RESIZING and CHECKPOINTING)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


#: The states of a job that is not over: what the daemon schedules and `dl2ctl queue` lists by default.
ACTIVE_STATES: tuple[JobState, ...] = tuple(s for s in JobState if not s.terminal)


class DecisionSource(str, enum.Enum):
    POLICY = "policy"
    FALLBACK = "fallback"


class EventKind(str, enum.Enum):
    SUBMIT = "submit"
    START = "start"
    RESIZE = "resize"
    RELAUNCH = "relaunch"
    HOT_SCALE = "hot_scale"
    FINISH = "finish"
    FAIL = "fail"
    CANCEL = "cancel"
    NODE_STALE = "node_stale"
    NODE_RECOVERED = "node_recovered"
    FALLBACK = "fallback"
    POLICY_REVERT = "policy_revert"  # the online learner put back to its last good parameters


class IntentState(str, enum.Enum):
    PLANNED = "PLANNED"
    ISSUED = "ISSUED"
    DONE = "DONE"
    FAILED = "FAILED"


def _enum(cls: type[enum.Enum], name: str) -> Enum:
    """VARCHAR + CHECK storing the enum's *values* (e.g. 'worker', not 'WORKER')."""
    return Enum(
        cls,
        name=name,
        native_enum=False,
        create_constraint=True,
        length=16,
        validate_strings=True,
        values_callable=lambda c: [m.value for m in c],
    )


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    owner: Mapped[str] = mapped_column(String(32), index=True)  # unix user name
    job_type: Mapped[str] = mapped_column(String(64), index=True)  # model name, e.g. "resnet-50"
    total_epochs: Mapped[float]  # the user's estimate
    epochs_done: Mapped[float] = mapped_column(default=0.0)
    # epochs trained and redone: a restart found no checkpoint holding them (the job's own report)
    lost_epochs: Mapped[float] = mapped_column(default=0.0, server_default="0")
    state: Mapped[JobState] = mapped_column(_enum(JobState, "job_state"), default=JobState.PENDING, index=True)
    #: validated submission: worker/ps demands, command, max_workers, max_ps, sync, time limit
    spec: Mapped[dict[str, Any]]
    slurm_job_id: Mapped[str | None] = mapped_column(String(32))  # current Slurm allocation
    submitted_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None] = mapped_column(index=True)
    workers: Mapped[int] = mapped_column(default=0)
    ps: Mapped[int] = mapped_column(default=0)
    #: an adaptive job's total batch as dl2d last started it (NULL: its submitted one)
    batch_size: Mapped[float | None]
    #: what dl2d learned of an adaptive job's gradient noise from its reports (efficiency.NoiseFit; NULL: nothing)
    batch_noise: Mapped[dict[str, Any] | None]

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.name!r} {self.job_type} {self.state.value} w={self.workers} ps={self.ps}>"


class Slot(Base):
    """One scheduling interval (default 20 min) and the reward observed at its end."""

    __tablename__ = "slots"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    number: Mapped[int] = mapped_column(unique=True)
    started_at: Mapped[datetime] = mapped_column(index=True)
    ended_at: Mapped[datetime | None]
    reward: Mapped[float | None]
    policy_version: Mapped[int | None]
    n_jobs: Mapped[int] = mapped_column(default=0)
    duration_ms: Mapped[float | None]  # time spent deciding and carrying out the plan

    allocations: Mapped[list[Allocation]] = relationship(back_populates="slot", cascade="all, delete-orphan")
    decision: Mapped[Decision | None] = relationship(back_populates="slot", cascade="all, delete-orphan")


class Allocation(Base):
    __tablename__ = "allocations"
    __table_args__ = (UniqueConstraint("slot_id", "job_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    slot_id: Mapped[int] = mapped_column(ForeignKey("slots.id", ondelete="CASCADE"))
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    workers: Mapped[int]
    ps: Mapped[int]
    prev_workers: Mapped[int] = mapped_column(default=0)
    prev_ps: Mapped[int] = mapped_column(default=0)

    slot: Mapped[Slot] = relationship(back_populates="allocations")


class Decision(Base):
    """What decided a slot's allocation: the policy in charge (``policy``, by name) or the guardrails' fallback
    heuristic (``source``)."""

    __tablename__ = "decisions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    slot_id: Mapped[int] = mapped_column(ForeignKey("slots.id", ondelete="CASCADE"), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    state_digest: Mapped[str] = mapped_column(String(64))  # sha256 hex of the policy input
    actions: Mapped[list[Any]]
    source: Mapped[DecisionSource] = mapped_column(_enum(DecisionSource, "decision_source"), index=True)
    #: the daemon's configured policy when the slot was decided (it changes at a reload); NULL: rows before 0008
    policy: Mapped[str | None] = mapped_column(Text)
    fallback_reason: Mapped[str | None] = mapped_column(Text)
    policy_version: Mapped[int | None]
    latency_ms: Mapped[float | None]
    #: {"<job id>": ["slow", "shared_gpu"]} for the jobs flagged from their measured stats (NULL: none)
    job_flags: Mapped[dict[str, Any] | None]
    #: advise mode: {"policy": name, "jobs": [[job id, workers, ps, advised epochs/s, epochs/s of what ran]]}, what
    #: the configured policy would have done (dl2d.daemon.plan.advice_record); NULL when the decision was carried out
    advice: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))  # None: SQL NULL, not 'null'

    slot: Mapped[Slot] = relationship(back_populates="decision")


class JobSlotStat(Base):
    """A job's measured speed and GPU features in one slot (`dl2d.daemon.jobstats.JobSlotStats`).

    `workers`/`ps` are the size the job ran with during the slot (what the prediction is for), which can
    differ from the slot's `allocations` row (the decision) when a resize failed."""

    __tablename__ = "job_slot_stats"
    __table_args__ = (UniqueConstraint("slot_id", "job_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    slot_id: Mapped[int] = mapped_column(ForeignKey("slots.id", ondelete="CASCADE"))
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    workers: Mapped[int]
    ps: Mapped[int]
    epochs: Mapped[float]  # trained in the slot
    epochs_per_s: Mapped[float]  # measured: epochs / slot seconds
    predicted_epochs_per_s: Mapped[float | None]  # the simulator's speed model for (workers, ps)
    speed_factor: Mapped[float | None]  # measured / predicted (NULL when the job ended mid-slot)
    ended: Mapped[bool] = mapped_column(default=False)  # finished or failed during the slot
    gpus: Mapped[int | None]  # GPUs seen running its processes (NULL: no agent sample showed it)
    gpu_util_mean_pct: Mapped[float | None]
    gpu_mem_per_gpu_max_bytes: Mapped[float | None]
    shared_gpu: Mapped[bool | None]  # a GPU of the job also ran another job's processes
    gpu_observations: Mapped[int] = mapped_column(default=0)  # GPU x sample pairs behind the GPU columns
    nodes: Mapped[int | None]  # nodes its tasks spanned (NULL: the backend named none; rows before 0006)


class NodeSample(Base):
    """A node agent's sample, or the mean of several (`n` samples merged, `resolution_s` > 0).

    Column names are the keys of `dl2d.agents.sample.sample_to_row` so that rows go to and from the pure
    `dl2d.db.retention.downsample()` unchanged; row keys without a column are kept in `payload`.
    `resolution_s` is 0 for raw samples, else the bucket width (60, 600) of a downsampled row.
    """

    __tablename__ = "node_samples"
    __table_args__ = (
        Index("ix_node_samples_node_ts", "node", "ts"),
        Index("ix_node_samples_resolution_ts", "resolution_s", "ts"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node: Mapped[str] = mapped_column(String(128))
    ts: Mapped[datetime]
    resolution_s: Mapped[int] = mapped_column(default=0)
    n: Mapped[int] = mapped_column(default=1)  # raw samples merged into this row
    gpu_count: Mapped[int] = mapped_column(default=0)
    gpu_util_mean_pct: Mapped[float | None]  # mean over the node's GPUs, 0..100
    gpu_util_max_pct: Mapped[float | None]
    gpu_mem_used_bytes: Mapped[float | None]  # summed over GPUs
    gpu_mem_total_bytes: Mapped[float | None]
    cpu_percent: Mapped[float | None]
    load1: Mapped[float | None]
    mem_used_bytes: Mapped[float | None]
    mem_total_bytes: Mapped[float | None]
    net_rx_bps: Mapped[float | None]  # bytes/s
    net_tx_bps: Mapped[float | None]
    payload: Mapped[dict[str, Any] | None]  # the row's other keys (power, temperature, ECC, job ids, ...)


class Event(Base):
    __tablename__ = "events"
    __table_args__ = (Index("ix_events_kind_ts", "kind", "ts"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    ts: Mapped[datetime] = mapped_column(default=utcnow)
    kind: Mapped[EventKind] = mapped_column(_enum(EventKind, "event_kind"))
    detail: Mapped[dict[str, Any] | None]


class Intent(Base):
    """The crash-safety journal: one Slurm action, written (PLANNED) before it is issued.

    See docs/database.md for the protocol; `idempotency_key` makes re-planning after a crash a no-op.
    """

    __tablename__ = "intents"
    __table_args__ = (Index("ix_intents_state", "state"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    slot_id: Mapped[int | None] = mapped_column(ForeignKey("slots.id", ondelete="SET NULL"), index=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    kind: Mapped[IntentKind] = mapped_column(_enum(IntentKind, "intent_kind"))
    target: Mapped[dict[str, Any]]  # {"workers": n, "ps": m, "nodes": [...]}
    idempotency_key: Mapped[str] = mapped_column(String(64), unique=True)
    state: Mapped[IntentState] = mapped_column(_enum(IntentState, "intent_state"), default=IntentState.PLANNED)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    error: Mapped[str | None] = mapped_column(Text)
