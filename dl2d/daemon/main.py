"""``dl2d``: the scheduler daemon (console script).

    dl2d --demo                         # today's world: simulated T4 cluster + a Philly workload, a result table
    dl2d --demo --world dl2             # the DL2 paper's world: PS jobs of its eight models
    dl2d --config /etc/dl2d/dl2d.toml   # the service (systemd/dl2d.service)

Wiring only: config -> database, backend, policy, agents poller, metrics, sd_notify -> SlotLoop.run.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import click

from dl2d.daemon.config import (
    DEFAULT_CONFIG,
    PLACEMENTS,
    POLICIES,
    WORLDS,
    ConfigError,
    DaemonConfig,
    PolicySection,
    agent_targets,
    load_config,
    policy_options,
)
from dl2d.daemon.hysteresis import Hysteresis

log = logging.getLogger("dl2d")


def setup_logging(level: str) -> None:
    """Logs on stdout (journald adds its own timestamps), with the logger's name; Alembic's set-up chatter and
    JAX's (which backends it probed, when a learned policy is built) only at debug level."""
    under_journald = bool(os.environ.get("JOURNAL_STREAM"))
    fmt = "%(levelname)s %(name)s: %(message)s"
    logging.basicConfig(stream=sys.stdout, level=getattr(logging, level.upper()),
                        format=fmt if under_journald else "%(asctime)s " + fmt, force=True)
    for chatty in ("alembic", "jax"):
        logging.getLogger(chatty).setLevel(logging.DEBUG if level.lower() == "debug" else logging.WARNING)


def make_backend(cfg: DaemonConfig, hidden=None):
    if cfg.backend == "sim":
        from dl2d.daemon.sim_backend import SimBackend
        from dl2d.sim.cluster import preset

        spec = preset(cfg.sim.cluster)
        if cfg.sim.servers:
            spec = replace(spec, num_servers=cfg.sim.servers)
        return SimBackend(spec, cfg.slot_seconds, cfg.sim.noise, cfg.sim.seed, cfg.sim.speed_model,
                          state_file=cfg.sim_state_file, hidden=hidden, resize_overhead_s=cfg.sim.resize_overhead_s,
                          shared_node_slowdown=cfg.sim.shared_node_slowdown)
    try:
        from dl2d.daemon.slurm.backend import backend_from_section
        from dl2d.slurm.driver import SlurmError
    except ImportError as e:
        raise ConfigError(f"config error: backend: the Slurm backend is not available ({e})") from None
    try:
        # policy.placement = "dltap": DLTAP's placement becomes the jobs' --nodelist, unless [slurm] says otherwise.
        return backend_from_section(cfg.slurm, cfg.state_dir, cfg.policy.placement)
    except (ValueError, SlurmError) as e:  # SlurmError: driver = "pyslurm" without a usable pyslurm
        raise ConfigError(f"config error: {e}") from None


def make_policy(cfg: DaemonConfig):
    """(policy, online learner or None), built by the policy registry; policy.placement = "dltap" wraps the
    policy with DLTAP (trimmed to the tasks placed, as the guardrails require)."""
    from dl2d.policy import registry
    from dl2d.policy.seeds.dltap import DLTAP

    try:
        policy = registry.build(cfg.policy.name, policy_options(cfg), cfg.policy.placement, trim=True)
    except registry.PolicyBuildError as e:
        raise ConfigError(f"config error: policy.checkpoint: {e}") from None
    base = policy.inner if isinstance(policy, DLTAP) else policy
    if cfg.policy.name != "dl2":
        log.info("policy: %s", policy.name)
    return policy, base if isinstance(base, registry.Learner) else None


def make_poller(cfg: DaemonConfig):
    targets = agent_targets(cfg)
    if not targets:
        return None
    from dl2d.agents.server import TokenFileError, load_token
    from dl2d.daemon.poller import Poller

    try:
        token = load_token(cfg.agents.token_file)
    except TokenFileError as e:
        raise ConfigError(f"config error: agents.token_file: {e}") from None
    return Poller(sorted(targets.items()), token, timeout=cfg.agents.timeout, stale_after=cfg.agents.stale_after)


DEMO_WORLDS = WORLDS


class DemoFeeder:
    """Submits the jobs of a demo trace as they arrive (slot k of the daemon = trace slot first + k).

    ``world`` (dl2d.sim.worlds): ``today`` (the default) draws a seeded workload of all-reduce jobs from the
    Philly trace at ``load`` for the cluster's GPUs (dl2d.workload.philly, dl2d.sim.trace.from_workload), each
    job submitted with its model, total batch and the GPUs it asked for (one GPU per worker); ``dl2`` generates
    a DL2 trace of PS jobs (``job_types``: only these of its eight types)."""

    def __init__(self, num_jobs: int, seed: int, job_types: tuple[str, ...] | None = None, world: str = "today",
                 slot_seconds: float | None = None, cluster_gpus: int = 64, load: float = 1.0):
        from dl2d.daemon.sim_backend import Hidden
        from dl2d.sim.worlds import world as world_of

        if world not in DEMO_WORLDS:
            raise ValueError(f"unknown world {world!r}; choose one of {', '.join(DEMO_WORLDS)}")
        self.world = world
        self.load = float(load) if world == "today" else None  # the DL2 world's traces have their own arrivals
        self.max_workers = world_of(world).max_workers
        if world == "dl2":
            from dl2d.sim.trace import TraceConfig, generate

            tc = TraceConfig(num_jobs=num_jobs, **({"job_types": tuple(job_types)} if job_types else {}))
            self.trace = generate(tc, seed=seed)
        else:
            if job_types:
                raise ValueError("the today world draws its models from the Philly trace; --demo-types picks DL2 "
                                 "types (give --world dl2)")
            from dl2d.sim.trace import from_workload
            from dl2d.workload import philly

            jobs = philly.generate(num_jobs, load=load, cluster_gpus=cluster_gpus, seed=seed,
                                   max_gpus=self.max_workers)
            self.trace = from_workload(jobs, slot_seconds or world_of(world).slot_seconds, seed=seed)
        self.slot_seconds = float(self.trace.config.get("slot_seconds") or 0.0)
        self.first = int(self.trace.arrival_slot.min())
        self.names = [f"demo-{i:04d}" for i in range(len(self.trace))]
        self.hidden = {n: Hidden(float(self.trace.true_epochs[i]), float(self.trace.speed_factor[i]))
                       for i, n in enumerate(self.names)}
        self.submitted: set[str] | None = None

    def submission(self, i: int) -> dict[str, Any]:
        """The submission of trace job ``i``, as a user would make it."""
        from dl2d.workload.catalog import ALLREDUCE_WORKER, MODEL_NAMES
        from dl2d.workload.jobtypes import JOB_TYPES

        t = int(self.trace.type_idx[i])
        base = {"name": self.names[i], "owner": "demo", "total_epochs": float(self.trace.est_epochs[i]),
                "command": "simulated"}
        if self.world == "dl2":
            jt = JOB_TYPES[t]
            return {**base, "job_type": jt.name, "worker": dict(zip(("gpus", "cpus", "mem_gb"), jt.worker_demand)),
                    "ps": {"cpus": jt.ps_demand[1], "mem_gb": jt.ps_demand[2]}}
        return {**base, "kind": "allreduce", "job_type": MODEL_NAMES[t], "batch_size": float(self.trace.batch_size[i]),
                "workers": int(self.trace.requested[i]), "max_workers": self.max_workers,
                "worker": dict(zip(("gpus", "cpus", "mem_gb"), ALLREDUCE_WORKER.as_array().tolist()))}

    def __call__(self, session, number: int, now) -> int:
        from dl2d.db.jobs import job_names_with_prefix, submit_job

        if self.submitted is None:
            self.submitted = job_names_with_prefix(session, "demo-")
        n = 0
        for i, name in enumerate(self.names):
            if name in self.submitted or self.trace.arrival_slot[i] - self.first > number:
                continue
            # submitted when the trace says, within the slot before the tick that first sees it (the daemon's
            # JCT counts from submission, as the simulator's does)
            early = float(self.trace.arrival_slot[i] - self.trace.submitted[i]) * self.slot_seconds
            submit_job(session, self.submission(i), now=now - timedelta(seconds=early))
            self.submitted.add(name)
            n += 1
        return n

    def exhausted(self) -> bool:
        return self.submitted is not None and len(self.submitted) == len(self.names)


#: The demo's trace where the command line does not say (``--demo-jobs``, ``--demo-load``), by world. Today's
#: world: 40 Philly jobs arriving at 3 times the Pollux workloads' rate (60 jobs an hour on the 64 GPUs of
#: t4-16), so that they contend for the cluster. Why not fewer or slower: each of these jobs is fastest on 1-4
#: GPUs at its own batch, so 20 of them at load 1 need 44 GPUs of the 64 even all at once (38 at the busiest
#: slot): every one starts at its fastest size, and no schedule has a reason to resize one (the bare simulator
#: makes no resize either). The DL2 world: 20 jobs.
DEMO_JOBS = {"today": 40, "dl2": 20}
DEMO_LOAD = {"today": 3.0}


def demo_overrides(world_name: str, cluster: str | None, slot_seconds: float | None) -> dict[str, Any]:
    """The config the demo of a world runs with (flags win): today's world on its cluster (t4-16), 60 s slots,
    its restart cost and shared-node slowdown, up to 64 workers a job; the DL2 world as the demo always ran
    (the config's cluster, 20-minute slots)."""
    if world_name != "today":
        return {"sim.cluster": cluster, "slot_seconds": slot_seconds, "policy.world": world_name}
    from dl2d.sim.worlds import world

    w = world(world_name)
    return {"sim.cluster": cluster or w.cluster, "slot_seconds": slot_seconds or w.slot_seconds,
            "sim.resize_overhead_s": w.resize_overhead_s, "sim.shared_node_slowdown": w.shared_node_slowdown,
            "max_workers": w.max_workers}


def demo_policy(world_name: str) -> str:
    """The demo's policy when none is given: the daemon's default, the recommended policy of today's clusters; in
    the DL2 paper's world of PS jobs the target-size policy trained there (dl2d/policy/target/pretrained)."""
    return "dl2-target" if world_name == "dl2" else PolicySection().name


def demo_cluster_gpus(cfg: DaemonConfig) -> int:
    """GPUs of the simulated cluster the config describes (the demo's workload load is per GPU)."""
    from dl2d.sim.cluster import preset

    spec = preset(cfg.sim.cluster)
    return int(spec.gpus * (cfg.sim.servers or spec.num_servers))


def build_loop(cfg: DaemonConfig, feeder: DemoFeeder | None = None, notifier=None, metrics=None, backend=None):
    """The daemon's slot loop for ``cfg``; ``backend``: one made by the caller (the conformance twin's simulated
    copy of a real cluster) instead of the config's."""
    from dl2d.daemon.loop import SlotLoop
    from dl2d.daemon.metrics import Metrics
    from dl2d.daemon.notify import Notifier
    from dl2d.db.engine import make_engine, upgrade
    from dl2d.policy import registry
    from dl2d.policy.registry import make_heuristic

    Path(cfg.state_dir).mkdir(parents=True, exist_ok=True)
    engine = open_database(cfg.database_url, make_engine, upgrade)
    backend = backend or make_backend(cfg, hidden=feeder.hidden if feeder else None)
    policy, learner = make_policy(cfg)
    poller = make_poller(cfg)
    clock = getattr(backend, "now", None)
    from dl2d.db.models import utcnow

    notifier = notifier or Notifier()
    backend.heartbeat = notifier.ping  # a backend that waits inside apply pings the watchdog meanwhile
    loop = SlotLoop(
        engine, backend, policy, make_heuristic(cfg.guardrails.fallback), slot_seconds=cfg.slot_seconds,
        starve_slots=cfg.guardrails.starve_slots, clock=clock or utcnow,
        pace=cfg.backend != "sim" or cfg.sim.pace, metrics=metrics or Metrics(), notifier=notifier,
        poller=poller, poll_interval=cfg.agents.poll_interval, retention_every=cfg.retention_every, feeder=feeder,
        learner=learner if cfg.policy.online_rl else None, checkpoint_path=cfg.policy_save_path,
        checkpoint_every=cfg.policy.checkpoint_every, status_file=cfg.status_file,
        hysteresis=Hysteresis(cfg.guardrails.min_resize_slots, cfg.guardrails.min_resize_gain),
        max_workers=cfg.max_workers, carried_out=registry.build("slurm") if cfg.mode == "advise" else None,
        pending_window=cfg.limits.pending_window, batch_rule=cfg.policy.batch,
        info={"backend": cfg.backend, "mode": cfg.mode, "policy": getattr(policy, "name", cfg.policy.name),
              "db_url": _safe_url(cfg.database_url), "slot_seconds": cfg.slot_seconds})
    return loop


#: Settings a running daemon cannot change: a reload that changes them logs that they wait for a restart.
RESTART_ONLY = ("state_dir", "db_url", "backend", "mode", "slot_seconds", "sim", "slurm", "agents", "metrics",
                "control", "admin_group", "limits")


class Reloader:
    """SIGHUP: read the configuration again (same file, environment and command line) and carry over what a
    running daemon can change: the policy (the online learner is checkpointed first and resumed from that
    checkpoint), the fallback heuristic, the guardrails, checkpointing, the log level. A file that does not
    validate, or a policy that cannot be built, is refused with the reason and nothing changes."""

    def __init__(self, cfg: DaemonConfig, config_path: str | None, overrides: dict[str, Any]):
        self.cfg, self.config_path, self.overrides = cfg, config_path, dict(overrides)

    def __call__(self, loop) -> None:
        loop.notifier.send("RELOADING=1", "STATUS=reloading the configuration")
        try:
            self.reload(loop)
        except Exception as e:  # a bad file or policy must never take the running daemon down
            log.error("reload refused, the running configuration stays: %s", e)
        loop.notifier.ready(f"policy {loop.info.get('policy')}")
        loop.write_status("running")

    def reload(self, loop) -> None:
        from dl2d.policy.registry import make_heuristic

        new = load_config(self.config_path, overrides=self.overrides)  # ConfigError: refused
        if loop.learner is not None and loop.checkpoint_path and loop.learner.stats.updates:
            loop.learner.save(loop.checkpoint_path, {"reload": True})
        policy, learner = make_policy(new)
        fallback = make_heuristic(new.guardrails.fallback)
        loop.policy, loop.fallback = policy, fallback
        loop.learner = learner if new.policy.online_rl else None
        loop.starve_slots = new.guardrails.starve_slots
        loop.hysteresis = Hysteresis(new.guardrails.min_resize_slots, new.guardrails.min_resize_gain)
        loop.checkpoint_path, loop.checkpoint_every = new.policy_save_path, new.policy.checkpoint_every
        loop.info["policy"] = policy.name
        setup_logging(new.log_level)
        waiting = [k for k in RESTART_ONLY if getattr(new, k) != getattr(self.cfg, k)]
        log.info("configuration reloaded: policy %s, fallback %s, starve_slots %d", policy.name, fallback.name,
                 new.guardrails.starve_slots)
        if waiting:
            log.warning("changed but only applied at a restart: %s", ", ".join(waiting))
        self.cfg = replace(new, **{k: getattr(self.cfg, k) for k in RESTART_ONLY})


def open_database(url: str, make_engine, upgrade):
    """The engine, migrated; any failure (server down, unknown driver, not a database, read-only or unwritable)
    is one ConfigError line naming the database, never a traceback."""
    from sqlalchemy.exc import DBAPIError

    try:
        engine = make_engine(url)
        upgrade(engine)
    except DBAPIError as e:
        first = str(e.orig).strip().splitlines()[0] if str(e.orig).strip() else type(e.orig).__name__
        hint = " (can this user write the state dir and the database file?)" if "sqlite" in url and (
            "readonly" in first or "unable to open" in first) else ""
        raise ConfigError(f"database {_safe_url(url)}: {first}{hint}") from None
    except Exception as e:  # an unknown dialect or a missing driver module, a broken URL
        raise ConfigError(f"database {_safe_url(url)}: {type(e).__name__}: {e}") from None
    return engine


#: Bits the daemon never gives a file it creates, whatever umask it was started with (the packaged unit's
#: UMask is the same): its database, status file, checkpoints and job records are root's and its group's. What
#: a job must read (its target, its script) is given its mode explicitly (dl2d.daemon.slurm.jobdir).
UMASK_BITS = 0o027


def restrict_umask() -> None:
    """Add :data:`UMASK_BITS` to the process's umask (a umask of 022 from a shell or cron would leave the database,
    and every job's declared secrets in it, world-readable)."""
    os.umask(os.umask(UMASK_BITS) | UMASK_BITS)


def lock_state_dir(state_dir: str):
    """An exclusive lock on ``<state_dir>/dl2d.lock`` held while the daemon runs (the open file is returned:
    keep it); a second daemon on the same state dir is refused, naming the first one's pid."""
    from dl2d.core.files import LockHeld, hold_lock

    path = Path(state_dir) / "dl2d.lock"
    try:
        return hold_lock(path)
    except LockHeld as e:
        raise ConfigError(f"another dl2d (pid {e.pid}) is running with state dir {state_dir}; stop it first, or "
                          "give this one its own state_dir") from None
    except OSError as e:
        raise ConfigError(f"config error: state_dir {state_dir}: cannot open {path.name}: {e.strerror}") from None


def serve_metrics(metrics, cfg: DaemonConfig) -> str | None:
    """Serve the Prometheus endpoint if the config says so; its URL (None: off). Called before the database is
    opened and the policy loaded, so that a port already in use is one line and exit 2 in a second, not after
    the slow part of the start-up (ConfigError)."""
    if not cfg.metrics.enabled:
        return None
    try:
        port = metrics.serve(cfg.metrics.port, cfg.metrics.bind)
    except OSError as e:
        raise ConfigError(f"cannot serve metrics on {cfg.metrics.bind}:{cfg.metrics.port}: {e.strerror}") from None
    log.info("metrics on http://%s:%d/metrics", cfg.metrics.bind, port)
    return f"http://{cfg.metrics.bind}:{port}/metrics"


def check_configuration(config_path: str | None, overrides: dict[str, Any]) -> int:
    """``dl2d --check-config``: build the config and the policy as a start would (the checkpoint loaded and
    checked), touching no file; print a summary or the error. Exit status: 0 valid, 2 not."""
    import os

    path = config_path or os.environ.get("DL2D_CONFIG") or DEFAULT_CONFIG
    try:
        cfg = load_config(config_path, overrides=overrides)
        policy, _learner = make_policy(cfg)
    except ConfigError as e:
        click.echo(f"dl2d: {e}", err=True)
        return 2
    click.echo(f"config OK: {path if Path(path).exists() else '(no file: defaults)'}")
    for key, value in (("backend", cfg.backend), ("mode", cfg.mode),
                       ("policy", getattr(policy, "name", cfg.policy.name) if policy is not None else cfg.policy.name),
                       ("fallback", cfg.guardrails.fallback), ("slot_seconds", f"{cfg.slot_seconds:g}"),
                       ("state_dir", cfg.state_dir), ("database", _safe_url(cfg.database_url)),
                       ("control socket", cfg.control_socket if cfg.control.enabled else "off"),
                       ("metrics", f"{cfg.metrics.bind}:{cfg.metrics.port}" if cfg.metrics.enabled else "off")):
        click.echo(f"  {key}: {value}")
    return 0


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


#: The demo's resizes of running jobs, by how the backend carried them out (the simulated cluster: a shrink or
#: stop is a resize, a growth a hot scaling, a move to other nodes a relaunch, a checkpoint-restart), each a row
#: of its report.
RESIZE_LABELS = {"resize": "resizes: shrink or stop", "hot_scale": "resizes: grown in place",
                 "relaunch": "resizes: relaunched"}


def demo_report(loop, cfg: DaemonConfig, feeder: DemoFeeder, compare: bool) -> dict[str, Any]:
    """The demo's result: JCTs from the daemon's DB, and the bare simulator on the same trace for reference."""
    import numpy as np

    from dl2d.db.engine import session_scope
    from dl2d.db.events import count_events
    from dl2d.db.jobs import jobs_with_name_prefix
    from dl2d.db.models import DecisionSource, JobState
    from dl2d.db.slots import count_decisions, count_slots

    with session_scope(loop.engine) as s:
        jobs = jobs_with_name_prefix(s, "demo-")
        done = [j for j in jobs if j.state == JobState.COMPLETED]
        jct_h = np.array([(j.finished_at - j.submitted_at).total_seconds() / 3600 for j in done])
        slots = count_slots(s)
        starts = count_events(s, ["start"])
        resizes = {kind: count_events(s, [kind]) for kind in RESIZE_LABELS}
        fallbacks = count_decisions(s, DecisionSource.FALLBACK)
        first = min(j.submitted_at for j in jobs) if jobs else None
        last = max((j.finished_at for j in done), default=None)
    out = {"world": feeder.world, "cluster": cfg.sim.cluster, "policy": cfg.policy.name, "jobs": len(jobs),
           **({"load": feeder.load} if feeder.load is not None else {}), "completed": len(done),
           "avg_jct_hours": round(float(jct_h.mean()), 3) if len(done) else None,
           "makespan_hours": round((last - first).total_seconds() / 3600, 3) if last else None,
           "slots": slots, "starts": starts, "resizes": resizes, "fallback_slots": fallbacks,
           "tick_ms_mean": round(float(np.mean(loop.state.tick_ms)), 2) if loop.state.tick_ms else None,
           "tick_ms_max": round(float(np.max(loop.state.tick_ms)), 2) if loop.state.tick_ms else None,
           "db_url": _safe_url(cfg.database_url)}
    if loop.learner is not None:  # learning online: the bare simulator's figure below is the policy greedy
        stats = loop.learner.stats
        out["online"] = (f"{stats.updates} updates, {getattr(stats, 'reverts', 0)} reverts, version {loop.learner.version}"
                         " (the bare simulator runs it greedy)")
    if compare:
        from dl2d.sim.cluster import preset
        from dl2d.sim.engine import SimConfig, run

        spec = preset(cfg.sim.cluster)
        if cfg.sim.servers:
            spec = replace(spec, num_servers=cfg.sim.servers)
        pol, _ = make_policy(replace(cfg, policy=replace(cfg.policy, online_rl=False)))
        sim = SimConfig(cluster=spec, slot_seconds=cfg.slot_seconds, slot_noise=cfg.sim.noise,
                        speed_model=cfg.sim.speed_model, resize_overhead_s=cfg.sim.resize_overhead_s,
                        shared_node_slowdown=cfg.sim.shared_node_slowdown,
                        max_workers=min(cfg.max_workers, feeder.max_workers))
        res = run(feeder.trace, pol, sim, seed=cfg.sim.seed)
        out["bare_sim_avg_jct_hours"] = round(res.avg_jct_hours, 3)
        from dl2d.sim.worlds import world

        best = world(feeder.world).best_heuristic
        if best != cfg.policy.name:  # what the best hand-written rule gets on the same trace
            from dl2d.policy import registry

            res = run(feeder.trace, registry.build(best), sim, seed=cfg.sim.seed)
            out["best_heuristic"] = best
            out["best_heuristic_avg_jct_hours"] = round(res.avg_jct_hours, 3)
    return out


def print_report(out: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="dl2d demo: simulated cluster, real daemon, SQLite")
    t.add_column("metric")
    t.add_column("value", justify="right")
    labels = {"world": "world", "cluster": "cluster", "policy": "policy", "jobs": "jobs submitted",
              "load": "arrival load (x Pollux's rate)", "completed": "jobs completed",
              "avg_jct_hours": "avg JCT (h, from the DB)", "bare_sim_avg_jct_hours": "avg JCT, bare simulator (h)",
              "best_heuristic": "best heuristic", "best_heuristic_avg_jct_hours": "its avg JCT, bare simulator (h)",
              "makespan_hours": "makespan (h)", "slots": "slots run", "starts": "job starts",
              "fallback_slots": "guardrail fallbacks", "online": "online learning", "tick_ms_mean": "tick mean (ms)", "tick_ms_max": "tick max (ms)",
              "db_url": "database"}
    for k, label in labels.items():
        if k not in out:
            continue
        t.add_row(label, str(out[k]))
        if k == "starts":
            for kind, n in out["resizes"].items():
                t.add_row(RESIZE_LABELS[kind], str(n))
    Console().print(t)
    db = out["db_url"]
    print(f"Reports: dl2ctl report --db {db}\nJobs:    dl2ctl queue --db {db}")


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dl2d", prog_name="dl2d")
@click.option("--config", "config_path", metavar="FILE", help="TOML config (default $DL2D_CONFIG or /etc/dl2d/dl2d.toml).")
@click.option("--check-config", "check_config", is_flag=True,
              help="Check the configuration (the file, DL2D_* variables and flags; the policy is built, so its "
                   "checkpoint is loaded and checked), print a summary and exit: 0 valid, 2 not. Writes nothing.")
@click.option("--state-dir", help="Directory for the SQLite DB, status file and simulated cluster.")
@click.option("--db", "db_url", metavar="URL", help="Database URL (default: SQLite in the state dir).")
@click.option("--backend", type=click.Choice(["sim", "slurm"]), help="Cluster backend.")
@click.option("--sim", "use_sim", is_flag=True, help="Shorthand for --backend sim.")
@click.option("--cluster", help="Simulated cluster preset (t4-16, t4-128, t4-512; tiny, small, testbed, dl2).")
@click.option("--slot-seconds", type=float, help="Slot length in seconds (default 1200; the today demo 60).")
@click.option("--policy", type=click.Choice(POLICIES),
              help="Scheduling policy [default: the config's, drf; the demo: dl2-target where a pretrained policy of "
                   "the world ships].")
@click.option("--placement", type=click.Choice(PLACEMENTS), help="Task placement: the policy's own or DLTAP.")
@click.option("--checkpoint", metavar="FILE", help="Trained policy: DL2 (dl2ctl train) or Chic (.npz).")
@click.option("--online-rl/--no-online-rl", default=None, help="Learn from every slot's reward.")
@click.option("--metrics-port", type=int, help="Prometheus endpoint port (0: any free port).")
@click.option("--no-metrics", is_flag=True, help="Do not serve metrics.")
@click.option("--slots", "max_slots", type=int, help="Stop after N slots.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--demo", is_flag=True, help="Simulated cluster + a generated trace; run until every job finishes, "
                                           "print the results and exit.")
@click.option("--world", type=click.Choice(DEMO_WORLDS), default="today", show_default=True,
              help="Demo: today's all-reduce jobs on 16 x 4 T4 GPUs, 60 s slots, a Philly workload; or dl2, the "
                   "DL2 paper's PS jobs (dl2d.sim.worlds).")
@click.option("--demo-jobs", type=int, help="Jobs in the demo trace [default: today 40, dl2 20].")
@click.option("--demo-load", type=float,
              help="Demo, today's world: the Philly trace's arrival rate, 1 = 20 jobs an hour per 64 GPUs "
                   "[default: 3].")
@click.option("--demo-seed", type=int, default=0, show_default=True, help="Seed of the demo trace.")
@click.option("--demo-types", metavar="T1,T2", help="Demo, --world dl2: only these job types (default: all 8).")
@click.option("--compare/--no-compare", default=True, show_default=True,
              help="Demo: also run the bare simulator with the same policy and trace, for reference.")
def main(config_path, check_config, state_dir, db_url, backend, use_sim, cluster, slot_seconds, policy, placement,
         checkpoint, online_rl, metrics_port, no_metrics, max_slots, log_level, demo, world, demo_jobs, demo_load,
         demo_seed, demo_types, compare) -> None:
    """The dl2d scheduler daemon: every slot, decide each job's workers and parameter servers and resize them."""
    restrict_umask()
    if demo and state_dir is None and not db_url:
        state_dir = tempfile.mkdtemp(prefix="dl2d-demo-")
    if demo and log_level is None:  # the demo's output is its report; --log-level info shows every slot's work
        log_level = "warning"
    overrides = {"state_dir": state_dir, "db_url": db_url, "backend": "sim" if (use_sim or demo) else backend,
                 "sim.cluster": cluster, "slot_seconds": slot_seconds,
                 **(demo_overrides(world, cluster, slot_seconds) if demo else {}),
                 "policy.name": policy or (demo_policy(world) if demo else None),
                 "policy.placement": placement, "policy.checkpoint": checkpoint, "policy.online_rl": online_rl,
                 "metrics.port": metrics_port, "max_slots": max_slots, "log_level": log_level}
    if no_metrics or (demo and metrics_port is None):
        overrides["metrics.enabled"] = False
    demo_jobs = DEMO_JOBS[world] if demo_jobs is None else demo_jobs
    if demo and demo_jobs < 1:
        raise click.UsageError("--demo-jobs must be >= 1")
    if demo_load is not None and (world != "today" or not 0 < demo_load < float("inf")):
        raise click.UsageError("--demo-load is a number > 0, for today's world (--world today)")
    demo_load = DEMO_LOAD.get(world, 1.0) if demo_load is None else demo_load
    if check_config:
        sys.exit(check_configuration(config_path, overrides))
    try:
        cfg = load_config(config_path, overrides=overrides)
        setup_logging(cfg.log_level)
        types = tuple(t.strip() for t in demo_types.split(",") if t.strip()) if demo_types else None
        try:
            feeder = DemoFeeder(demo_jobs, demo_seed, types, world, cfg.slot_seconds, demo_cluster_gpus(cfg),
                                demo_load) if demo else None
        except ValueError as e:
            raise ConfigError(f"--demo-types: {e}") from None
        try:
            Path(cfg.state_dir).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"config error: state_dir {cfg.state_dir}: {e.strerror} "
                              "(run as the dl2d user, or set state_dir / --state-dir)") from None
        lock = lock_state_dir(cfg.state_dir)  # noqa: F841  (held until the process exits)
        from dl2d.daemon.metrics import Metrics

        metrics = Metrics()
        metrics_url = serve_metrics(metrics, cfg)  # before the slow steps (database, policy): a port in use at once
        try:
            loop = build_loop(cfg, feeder, metrics=metrics)
            hold = getattr(loop.backend, "lock", None)  # the Slurm backend's state dir, which daemons must not share
            if hold is not None:
                try:
                    hold()
                except (OSError, ValueError) as e:
                    raise ConfigError(f"config error: {e}") from None
        except BaseException:
            metrics.close()
            raise
    except ConfigError as e:
        click.echo(f"dl2d: {e}", err=True)
        sys.exit(2)
    if metrics_url:
        loop.info["metrics_url"] = metrics_url
    control = None
    if cfg.control.enabled:
        from dl2d.daemon.control import ControlError, ControlServer

        from dl2d.daemon.quota import Limits

        lim = cfg.limits
        control = ControlServer(cfg.control_socket, loop.engine, cfg.admin_group, status=loop.status_doc,
                                limits=Limits(lim.max_submit_jobs, lim.max_pending_jobs, lim.submit_rate))
        try:
            control.start()
        except ControlError as e:
            loop.metrics.close()
            click.echo(f"dl2d: {e}", err=True)
            sys.exit(2)
        loop.info["control_socket"] = cfg.control_socket

    def on_signal(signum, _frame):
        log.info("%s received: finishing the current slot, then stopping", signal.Signals(signum).name)
        loop.stop.set()

    def on_hangup(_signum, _frame):
        log.info("SIGHUP received: reloading the configuration after the current slot")
        loop.reload.set()

    loop.reloader = Reloader(cfg, config_path, overrides)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGHUP, on_hangup)
    log.info("dl2d starting: backend %s, policy %s, slot %gs, database %s, state dir %s", cfg.backend,
             cfg.policy.name + (" (advise only: Slurm's own schedule is carried out)" if cfg.mode == "advise" else ""),
             cfg.slot_seconds, _safe_url(cfg.database_url), cfg.state_dir)
    loop.notifier.ready(f"backend {cfg.backend}, policy {cfg.policy.name}"
                        + (", advise only" if cfg.mode == "advise" else ""))
    try:
        n = loop.run(max_slots=cfg.max_slots,
                     until_idle=(lambda: feeder.exhausted() and loop.idle()) if feeder else None)
    finally:
        loop.notifier.stopping()
        loop.metrics.close()
        if control is not None:
            control.close()
    log.info("dl2d stopped after %d slot(s)", n)
    if feeder is not None:
        print_report(demo_report(loop, cfg, feeder, compare))


if __name__ == "__main__":  # pragma: no cover
    main()
