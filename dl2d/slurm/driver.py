"""What dl2d needs from Slurm: the :class:`SlurmDriver` protocol, its data types and errors.

Two implementations exist: :mod:`dl2d.slurm.cli_driver` (``sbatch``/``squeue --json``/
``scontrol``; works with Slurm 22.05 from Debian) and :mod:`dl2d.slurm.pyslurm_driver`
(``pyslurm``, which needs Slurm 25.11). Pick one with :func:`make_driver`.

Design (see docs/slurm.md): one dl2d job = one Slurm batch job; its nodes host the job's workers
and parameter servers (started with ``srun`` steps by the job's launcher). Shrinking is done in
place (``scontrol update NumNodes``); growing is checkpoint + requeue at the new size.
"""

from __future__ import annotations

import os
import pwd
import time
from dataclasses import dataclass, field
from typing import Mapping, Protocol, runtime_checkable

#: Prefix of the Slurm job comment that carries the dl2d job id and its submission's token
#: (``--comment=dl2d:<id>:<token>``; ``dl2d:<id>`` without a token).
COMMENT_PREFIX = "dl2d:"


def submission_comment(dl2d_job_id: str, token: str | None = None) -> str:
    """The Slurm comment of a dl2d job's submission: its id and, where given, the submission's token (the
    daemon adopts an unknown Slurm job only when its comment carries the token the daemon recorded before
    submitting, and its user is the job's: anyone can name a job and comment it with a guessed id)."""
    return f"{COMMENT_PREFIX}{dl2d_job_id}" + (f":{token}" if token else "")


class SlurmError(RuntimeError):
    """A Slurm command or call failed. ``command`` is what was run, ``returncode`` its exit code
    (None when it did not exit, e.g. a library call), ``stderr`` what it said."""

    def __init__(self, message: str, *, command: tuple[str, ...] | str = (),
                 returncode: int | None = None, stderr: str = "") -> None:
        self.command = tuple(command) if not isinstance(command, str) else (command,)
        self.returncode = returncode
        self.stderr = stderr
        detail = message
        if self.command:
            detail += f" [command: {' '.join(self.command)}"
            detail += f"; exit code {returncode}]" if returncode is not None else "]"
        if stderr.strip():
            detail += f": {stderr.strip()}"
        super().__init__(detail)


class SlurmUnavailable(SlurmError):
    """The controller could not be reached (down, timed out, restarting): retry later with
    backoff (see :mod:`dl2d.slurm.backoff`). Other :class:`SlurmError` s are not worth retrying."""


class UnknownUserError(SlurmError):
    """A job's user has no account (passwd entry) on this host: it cannot run as that user, now or later."""


@dataclass(frozen=True)
class UnixUser:
    """A unix account a job runs as: what the job's environment and the switch to that user need."""

    name: str
    uid: int
    gid: int
    home: str
    shell: str
    groups: tuple[int, ...] = ()  # supplementary groups (initgroups' list, the primary group included)


def lookup_user(name: str) -> UnixUser:
    """The passwd entry of ``name`` and its groups; :class:`UnknownUserError` (naming the user) when there is
    none. Looked up at each submission, so an account added or removed later counts."""
    try:
        pw = pwd.getpwnam(name)
    except (KeyError, ValueError):  # ValueError: a name with a NUL byte
        raise UnknownUserError(f"user {name!r} has no account on this host (no passwd entry): "
                               "a job cannot run as that user") from None
    try:
        groups = tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))
    except OSError:
        groups = (pw.pw_gid,)
    return UnixUser(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir or "/", pw.pw_shell or "/bin/sh", groups)


def process_user() -> UnixUser:
    """The account this process runs as (its effective uid); a uid without a passwd entry (a container's
    arbitrary uid) is named by its number, with ``/`` as its home."""
    uid, gid = os.geteuid(), os.getegid()
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return UnixUser(str(uid), uid, gid, "/", "/bin/sh", (gid,))
    return UnixUser(pw.pw_name, uid, gid, pw.pw_dir or "/", pw.pw_shell or "/bin/sh", tuple(os.getgroups()))


#: PATH of a job: the system's directories, in Debian's order (what a login shell of a plain user gets); a job
#: that needs more declares its own PATH (``JobSpec.env``).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: The locale of a job that declares none.
DEFAULT_LANG = "C.UTF-8"


def job_environment(user: UnixUser, declared: Mapping[str, str] | None = None, *,
                    slurm_conf: str | None = None) -> dict[str, str]:
    """The whole environment a job is submitted with (Slurm's ``--export=ALL`` of it; Slurm adds its
    ``SLURM_*``): a fixed PATH and locale, the account's HOME/USER/LOGNAME/SHELL, ``SLURM_CONF`` when the
    cluster's configuration is not in the default place, then what the job declares (``declared`` wins).
    Never anything of the submitting process's own environment: a daemon's database URL or token must not
    reach every job. Pure; ValueError for what no environment can hold: an empty name, one with ``=``, a NUL
    byte (which names a job may declare is the submission's rule: dl2d.db.jobs)."""
    env = {"PATH": DEFAULT_PATH, "LANG": DEFAULT_LANG, "HOME": user.home, "USER": user.name,
           "LOGNAME": user.name, "SHELL": user.shell}
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    for name, value in (declared or {}).items():
        if not isinstance(name, str) or not name or "=" in name or "\x00" in name:
            raise ValueError(f"not an environment variable name: {name!r}")
        if not isinstance(value, str) or "\x00" in value:
            raise ValueError(f"environment variable {name}: the value must be text without NUL bytes")
        env[name] = value
    return env


@dataclass(frozen=True)
class JobSpec:
    """What to submit for one dl2d job. Exactly one of ``command`` (run by ``/bin/sh`` as the
    batch script) or ``script`` (a whole batch script, ``#!`` line included) must be given."""

    name: str
    command: str | None = None
    script: str | None = None
    nodes: int = 1
    ntasks_per_node: int | None = None
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    #: CPUs and memory (MB) to allocate on every node (``--mincpus``, ``--mem``): what the job's tasks on
    #: its busiest node need, so that Slurm accounts (and, with cgroups, enforces) what dl2d planned.
    #: None: not requested (Slurm's defaults apply).
    cpus_per_node: int | None = None
    mem_mb_per_node: int | None = None
    time_limit_min: int | None = None
    #: What the job's environment holds beyond :func:`job_environment`'s base (its declared variables)
    env: Mapping[str, str] = field(default_factory=dict)
    output: str | None = None
    workdir: str | None = None
    partition: str | None = None
    #: Signal sent by Slurm ``checkpoint_signal_secs`` before the time limit (``--signal=B:SIG@T``),
    #: so that the program checkpoints before it is killed. None: no such signal.
    checkpoint_signal: str | None = "USR1"
    checkpoint_signal_secs: int = 60
    requeue: bool = True
    nodelist: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    #: dl2d job id; stored as the Slurm job comment ``dl2d:<id>[:<token>]`` so jobs can be matched back.
    dl2d_job_id: str | None = None
    #: this submission's secret token (:func:`submission_comment`); None: the comment carries the id alone
    submit_token: str | None = None
    #: The unix user the job runs as (and is accounted to: sacct, fairshare, QOS limits); None: the user the
    #: driver runs as. Another user than the driver's needs the driver to run as root.
    user: str | None = None
    #: Slurm account and QOS to charge (``--account``, ``--qos``); None: the user's defaults.
    account: str | None = None
    qos: str | None = None

    def __post_init__(self) -> None:
        if (self.command is None) == (self.script is None):
            raise ValueError("JobSpec needs exactly one of command= or script=")
        if self.nodes < 1:
            raise ValueError(f"JobSpec.nodes must be >= 1, got {self.nodes}")
        if self.gpus_per_node < 0:
            raise ValueError(f"JobSpec.gpus_per_node must be >= 0, got {self.gpus_per_node}")
        for name in ("cpus_per_node", "mem_mb_per_node"):
            value = getattr(self, name)
            if value is not None and value < 1:  # --mem=0 would mean "all of the node's memory"
                raise ValueError(f"JobSpec.{name} must be >= 1 or None, got {value}")

    @property
    def comment(self) -> str | None:
        return None if self.dl2d_job_id is None else submission_comment(self.dl2d_job_id, self.submit_token)


@dataclass(frozen=True)
class SlurmJob:
    """One Slurm job as seen by the daemon. ``state`` is Slurm's base state in upper case
    (PENDING, RUNNING, COMPLETING, COMPLETED, CANCELLED, FAILED, TIMEOUT, ...)."""

    job_id: str
    name: str
    state: str
    reason: str = ""
    node_list: str = ""
    nodes: tuple[str, ...] = ()
    num_nodes: int = 0
    gpus_per_node: int = 0
    comment: str = ""
    restarts: int = 0
    submit_time: int | None = None
    start_time: int | None = None
    time_limit_min: int | None = None
    batch_host: str = ""
    cpus_per_node: int = 0  # CPUs allocated on each node (MinCPUsNode); 0: not reported
    mem_mb_per_node: int = 0  # memory per node in MB (MinMemoryNode); 0: not requested per node / unknown
    #: unix seconds. For a job that has ended, when it ended (Slurm's EndTime); for an active job
    #: Slurm reports its expected end (start + time limit), which says nothing.
    end_time: int | None = None
    user: str = ""  # the user the job runs as (Slurm's UserId, by name); "": not reported

    @property
    def dl2d_job_id(self) -> str | None:
        """The dl2d job id from the comment (``dl2d:<id>[:<token>]``), or None for jobs dl2d did not submit."""
        if self.comment.startswith(COMMENT_PREFIX):
            return self.comment[len(COMMENT_PREFIX):].split(":", 1)[0]
        return None

    @property
    def active(self) -> bool:
        """Pending, running or otherwise not finished."""
        return self.state in ACTIVE_JOB_STATES


ACTIVE_JOB_STATES = frozenset(
    {"PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "REQUEUED",
     "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED"})


@dataclass(frozen=True)
class SlurmNode:
    """One compute node. ``state`` is the base state in lower case (idle, mixed, allocated, down,
    unknown, ...); ``flags`` the upper-case state flags (DRAIN, NOT_RESPONDING, ...)."""

    name: str
    state: str
    flags: tuple[str, ...] = ()
    cpus: int = 0
    cpus_alloc: int = 0
    gpus: int = 0
    gpus_alloc: int = 0
    reason: str = ""
    partitions: tuple[str, ...] = ()
    mem_mb: int = 0  # configured memory (RealMemory); 0 when not reported

    @property
    def drained(self) -> bool:
        return "DRAIN" in self.flags or self.state in ("drained", "draining")

    @property
    def usable(self) -> bool:
        """Up and schedulable (not down, drained or not responding)."""
        return (self.state in ("idle", "mixed", "allocated", "completing")
                and not self.drained and "NOT_RESPONDING" not in self.flags)

    @property
    def gpus_free(self) -> int:
        return max(self.gpus - self.gpus_alloc, 0) if self.usable else 0


@runtime_checkable
class SlurmDriver(Protocol):
    """Operations the daemon performs on Slurm. All raise :class:`SlurmUnavailable` when the
    controller cannot be reached and :class:`SlurmError` for any other failure."""

    def submit(self, spec: JobSpec) -> str:
        """Submit a batch job; returns the Slurm job id."""

    def jobs(self) -> list[SlurmJob]:
        """All jobs the controller knows (finished ones until ``MinJobAge`` passes)."""

    def nodes(self) -> list[SlurmNode]:
        """All compute nodes."""

    def shrink(self, job_id: str, num_nodes: int) -> None:
        """Release nodes of a running job in place, keeping ``num_nodes`` (Slurm keeps the
        first nodes of the allocation, including the batch host)."""

    def signal(self, job_id: str, sig: str) -> None:
        """Send a signal (name like ``USR1`` or number) to the batch script and all steps."""

    def requeue(self, job_id: str, num_nodes: int | None = None) -> None:
        """Requeue a batch job (running ones are killed; finished ones are restarted) and
        optionally change its node count — the way to grow a job after it checkpointed."""

    def cancel(self, job_id: str) -> None:
        """Cancel a job."""

    def drain_node(self, node: str, reason: str) -> None:
        """Stop scheduling onto ``node``; running jobs continue."""

    def resume_node(self, node: str) -> None:
        """Undo a drain (or bring a down node back)."""

    def ping(self) -> bool:
        """True when the controller answers. Never raises for an unreachable controller."""


def wait_for_state(driver: SlurmDriver, job_id: str, state: str, timeout: float,
                   interval: float = 0.2) -> SlurmJob:
    """Poll ``driver.jobs()`` until job ``job_id`` is in ``state``; SlurmError on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        job = next((j for j in driver.jobs() if j.job_id == str(job_id)), None)
        if job is None:
            raise SlurmError(f"job {job_id} disappeared while waiting for {state}")
        if job.state == state:
            return job
        if time.monotonic() > deadline:
            raise SlurmError(f"job {job_id} still {job.state} after {timeout:g}s "
                             f"(waiting for {state})")
        time.sleep(interval)


DRIVERS = ("cli", "pyslurm")


def make_driver(kind: str = "cli", **options: object) -> SlurmDriver:
    """Create a driver by name: ``"cli"`` (default, any Slurm with JSON output, incl. 22.05) or
    ``"pyslurm"`` (needs Slurm 25.11 and ``pip install pyslurm``). ``options`` go to the
    driver's constructor."""
    if kind == "cli":
        from dl2d.slurm.cli_driver import CliDriver
        return CliDriver(**options)  # type: ignore[arg-type]
    if kind == "pyslurm":
        from dl2d.slurm.pyslurm_driver import PyslurmDriver
        return PyslurmDriver(**options)  # type: ignore[arg-type]
    raise ValueError(f"unknown Slurm driver {kind!r}; choose one of {', '.join(DRIVERS)}")
