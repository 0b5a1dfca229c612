"""Settings of the Slurm backend: :class:`SlurmBackendConfig`, and the ``[slurm]`` table of dl2d.toml.

The table is :class:`SlurmSection`, a section of dl2d/daemon/config.py's :class:`DaemonConfig` like the
others: config.py's ``_merge``/``_coerce`` check its keys and TOML types (errors name the key path and
where the value came from; ``DL2D_SLURM_<KEY>`` variables override it). What only the backend can judge
(driver names, positive timeouts, the node_shape and backoff tables) is checked here when the backend is
built (:func:`settings_from_section`, pure). This module imports nothing heavy: config.py imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dl2d.core.signals import checkpoint_signal
from dl2d.slurm.backoff import BackoffPolicy

if TYPE_CHECKING:
    from dl2d.daemon.slurm.mapping import NodeShape

RESTART_METHODS = ("resubmit", "requeue")
#: SlurmBackendConfig.placement: slurm = Slurm picks the nodes (the target's placement is ignored);
#: target = the target's placement (e.g. DLTAP's) is the job's --nodelist (mapping.target_selection).
PLACEMENTS = ("slurm", "target")
#: SlurmBackendConfig.run_jobs_as: owner = every job runs as the user who submitted it (the daemon must be root);
#: daemon = every job runs as the daemon's own user (a single-user cluster, where that user is the only submitter).
RUN_JOBS_AS = ("owner", "daemon")


@dataclass
class SlurmBackendConfig:
    """Settings of :class:`~dl2d.daemon.slurm.backend.SlurmBackend`.

    state_dir: where job directories live (must be on a file system the compute nodes share).
    restart_method: ``"resubmit"`` (default: checkpoint, let the job end, submit a new Slurm job
      at the new size — starts as soon as resources are free) or ``"requeue"`` (checkpoint, then
      ``scontrol requeue`` with the new size — keeps the Slurm job id, but Slurm holds it for
      ``cred_expire``, 120 s by default; see docs/slurm.md). Requeue can change the node count
      only, so a restart that changes the GPUs per node resubmits in either mode.
    checkpoint_signal / checkpoint_timeout_s: the signal that makes a job checkpoint and exit,
      and how long to wait for it to end before cancelling it (scancel: SIGTERM, then SIGKILL).
    node_shape: size allocations by this node instead of the smallest usable node from sinfo.
    job_name_prefix: Slurm job names are ``<prefix><dl2d id>``.
    run_jobs_as: ``"owner"`` (default: a job runs as, and is accounted to, the user who submitted it; needs a
      daemon running as root) or ``"daemon"`` (every job runs as the daemon's user: single-user setups only).
    """

    state_dir: Path
    restart_method: str = "resubmit"
    checkpoint_signal: str = "USR1"
    checkpoint_timeout_s: float = 120.0
    poll_interval_s: float = 0.25
    node_shape: NodeShape | None = None
    job_name_prefix: str = "dl2d-"
    partition: str | None = None
    time_limit_min: int | None = None  # default when the spec gives none
    workdir: str | None = None
    hot_scale_timeout_s: float = 120.0
    #: apply() reuses the job/node lists of the last observe()/apply() this long (any change
    #: made through the backend drops them), so a slot costs one squeue + one sinfo.
    cache_ttl_s: float = 5.0
    backoff: BackoffPolicy = field(default_factory=lambda: BackoffPolicy(max_attempts=4, cap=5.0))
    #: "slurm" (Slurm picks the nodes) or "target" (the target's placement as --nodelist, see PLACEMENTS)
    placement: str = "slurm"
    #: "owner" or "daemon", see RUN_JOBS_AS
    run_jobs_as: str = "owner"
    #: seconds a job that says done may run on before its Slurm job is cancelled (it holds GPUs meanwhile)
    done_grace_s: float = 30.0

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir)
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}")
        if self.run_jobs_as not in RUN_JOBS_AS:
            raise ValueError(f"run_jobs_as must be one of {', '.join(RUN_JOBS_AS)}, got {self.run_jobs_as!r}")
        if self.restart_method not in RESTART_METHODS:
            raise ValueError(f"restart_method must be one of {', '.join(RESTART_METHODS)}, "
                             f"got {self.restart_method!r}")
        if self.checkpoint_timeout_s <= 0:
            raise ValueError("checkpoint_timeout_s must be > 0")
        try:
            checkpoint_signal(self.checkpoint_signal)
        except ValueError as e:
            raise ValueError(f"checkpoint_signal: {e}") from None


@dataclass(frozen=True)
class SlurmSection:
    """The ``[slurm]`` table of dl2d.toml (docs/daemon.md, "Running on Slurm"); every key is optional.
    TOML has no null, so ``""`` and ``0`` mean "not set" where the backend has no value of its own;
    the other defaults are :class:`SlurmBackendConfig`'s."""

    driver: str = "cli"  # dl2d.slurm.driver.DRIVERS
    slurm_conf: str = ""  # cli: SLURM_CONF for the commands ("": their environment)
    command_timeout_s: float = 0.0  # cli: seconds per command (0: the driver's default)
    state_dir: str = ""  # "": <the daemon's state_dir>/slurm
    restart_method: str = SlurmBackendConfig.restart_method
    checkpoint_signal: str = SlurmBackendConfig.checkpoint_signal
    checkpoint_timeout_s: float = SlurmBackendConfig.checkpoint_timeout_s
    poll_interval_s: float = SlurmBackendConfig.poll_interval_s
    job_name_prefix: str = SlurmBackendConfig.job_name_prefix
    partition: str = ""  # "": the cluster's default partition
    time_limit_min: int = 0  # when the spec gives none (0: the partition's limit)
    workdir: str = ""  # sbatch --chdir ("": Slurm's default)
    hot_scale_timeout_s: float = SlurmBackendConfig.hot_scale_timeout_s
    cache_ttl_s: float = SlurmBackendConfig.cache_ttl_s
    node_shape: dict[str, Any] = field(default_factory=dict)  # {gpus, cpus, mem_gb}; {}: sinfo's smallest node
    backoff: dict[str, Any] = field(default_factory=dict)  # BackoffPolicy fields; {}: the backend's default
    placement: str = ""  # "": "target" when policy.placement = "dltap", else "slurm"
    run_jobs_as: str = SlurmBackendConfig.run_jobs_as  # "owner" (the daemon runs as root) | "daemon" (single user)
    done_grace_s: float = SlurmBackendConfig.done_grace_s


_BACKOFF_KEYS = ("base", "factor", "cap", "jitter", "max_attempts", "max_elapsed")
_NODE_SHAPE_KEYS = ("gpus", "cpus", "mem_gb")


def _node_shape(table: dict[str, Any]) -> NodeShape:
    from dl2d.daemon.slurm.mapping import NodeShape

    if set(table) != set(_NODE_SHAPE_KEYS):
        raise ValueError("slurm.node_shape: needs exactly gpus, cpus and mem_gb")
    for key in _NODE_SHAPE_KEYS:
        v = table[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"slurm.node_shape.{key}: must be a number >= 0, got {v!r}")
    return NodeShape(int(table["gpus"]), int(table["cpus"]), float(table["mem_gb"]))


def _backoff(table: dict[str, Any]) -> BackoffPolicy:
    bad = set(table) - set(_BACKOFF_KEYS)
    if bad:
        raise ValueError(f"slurm.backoff.{sorted(bad)[0]}: unknown key; known: {', '.join(_BACKOFF_KEYS)}")
    try:
        return BackoffPolicy(**table)
    except (TypeError, ValueError) as e:
        raise ValueError(f"slurm.backoff: {e}") from None


def settings_from_section(section: SlurmSection, default_state_dir: str | Path,
                          policy_placement: str = "balance") -> tuple[str, dict[str, Any], SlurmBackendConfig]:
    """The ``[slurm]`` section -> (driver kind, driver options, backend config). Pure; raises ValueError
    naming the key (``slurm.<key>: ...``). ``policy_placement`` is the daemon's ``policy.placement``:
    with ``"dltap"`` DLTAP's placement becomes the jobs' --nodelist unless the section says otherwise."""
    from dl2d.slurm.driver import DRIVERS

    s = section
    if s.driver not in DRIVERS:
        raise ValueError(f"slurm.driver: must be one of {', '.join(DRIVERS)}, got {s.driver!r}")
    options: dict[str, Any] = {}
    if s.driver == "cli":
        if s.command_timeout_s:
            if s.command_timeout_s < 0:
                raise ValueError(f"slurm.command_timeout_s: must be > 0, got {s.command_timeout_s:g}")
            options["timeout"] = float(s.command_timeout_s)
        if s.slurm_conf:
            options["env"] = {"SLURM_CONF": s.slurm_conf}
    elif s.slurm_conf or s.command_timeout_s:
        raise ValueError("slurm.slurm_conf / slurm.command_timeout_s: only for driver = \"cli\" "
                         "(pyslurm reads SLURM_CONF from the environment)")
    for key in ("checkpoint_timeout_s", "poll_interval_s", "hot_scale_timeout_s", "done_grace_s"):
        if getattr(s, key) <= 0:
            raise ValueError(f"slurm.{key}: must be > 0, got {getattr(s, key):g}")
    for key in ("cache_ttl_s", "time_limit_min"):
        if getattr(s, key) < 0:
            raise ValueError(f"slurm.{key}: must be >= 0, got {getattr(s, key):g}")
    kw: dict[str, Any] = dict(
        state_dir=Path(s.state_dir or Path(default_state_dir) / "slurm"),
        restart_method=s.restart_method, checkpoint_signal=s.checkpoint_signal,
        checkpoint_timeout_s=s.checkpoint_timeout_s, poll_interval_s=s.poll_interval_s,
        job_name_prefix=s.job_name_prefix, partition=s.partition or None,
        time_limit_min=s.time_limit_min or None, workdir=s.workdir or None,
        hot_scale_timeout_s=s.hot_scale_timeout_s, cache_ttl_s=s.cache_ttl_s,
        placement=s.placement or ("target" if policy_placement == "dltap" else "slurm"),
        run_jobs_as=s.run_jobs_as, done_grace_s=s.done_grace_s,
    )
    if s.node_shape:
        kw["node_shape"] = _node_shape(s.node_shape)
    if s.backoff:
        kw["backoff"] = _backoff(s.backoff)
    try:
        config = SlurmBackendConfig(**kw)
    except ValueError as e:
        raise ValueError(f"slurm: {e}") from None
    return s.driver, options, config


def run_jobs_as_problem(run_jobs_as: str, euid: int) -> str | None:
    """Why a daemon of effective uid ``euid`` cannot run jobs as ``run_jobs_as`` says (None: it can). Pure."""
    if run_jobs_as == "owner" and euid != 0:
        return (f'slurm.run_jobs_as = "owner": jobs run as the users who submit them, which needs the daemon to run '
                f'as root (it runs as uid {euid}); run it as root (systemd/dl2d.service), or set run_jobs_as = '
                '"daemon" on a single-user cluster, where every job may run as the daemon\'s user')
    return None
