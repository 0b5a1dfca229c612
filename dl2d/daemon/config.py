"""The daemon's configuration: one TOML file, overridden by ``DL2D_*`` environment variables, then flags.

Precedence (last wins): built-in defaults < the TOML file (``--config``, ``$DL2D_CONFIG`` or
``/etc/dl2d/dl2d.toml``; a missing default file is fine, a missing named file is an error) < environment
(``DL2D_<SECTION>_<KEY>``, e.g. ``DL2D_SLOT_SECONDS``, ``DL2D_POLICY_NAME``, ``DL2D_SIM_CLUSTER``) < command
line flags. Every value is checked; errors name the key path and where the value came from
(``config error: policy.checkpoint_every (from /etc/dl2d/dl2d.toml): must be >= 1, got 0``).

Parsing and validation are pure (:func:`build_config` takes the TOML dict, the environment mapping and the
overrides); :func:`load_config` is the thin I/O shell that reads the file. See docs/daemon.md for every key.
"""
from __future__ import annotations

import difflib

import math
import os
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Mapping, get_type_hints

from dl2d.core.files import TomlFileError, read_toml_file
from dl2d.daemon.slurm.settings import SlurmSection
from dl2d.policy import registry

DEFAULT_CONFIG = "/etc/dl2d/dl2d.toml"
DEFAULT_STATE_DIR = "/var/lib/dl2d"
#: policy.name: every policy of the registry fit for a real cluster; guardrails.fallback: its heuristics.
POLICIES = registry.names(daemon=True)
ONLINE_EXPLORE = registry.ONLINE_EXPLORE
HEURISTICS = registry.names(heuristic=True)
#: policy.placement: balance = the policy's own placement (load balancing); dltap = DLTAP re-places its tasks.
PLACEMENTS = registry.PLACEMENTS
BACKENDS = ("sim", "slurm")
#: policy.world: dl2d.sim.worlds.WORLDS (named here so that the config loads without the simulator; a test
#: keeps the two equal)
WORLDS = ("today", "dl2")


MODES = ("enforce", "advise")
#: How alike (difflib ratio) an unknown DL2D_* variable and a setting's must be to call it a typo: typos of one
#: or two letters score 0.96-0.98; the other tools' variables (DL2D_WORKERS, DL2D_SLURM_DIR) at most 0.88.
TYPO_CUTOFF = 0.9


class ConfigError(ValueError):
    """A configuration problem; the message names the key path and the source of the value."""


@dataclass(frozen=True)
class SimSection:
    cluster: str = "small"  # preset of dl2d.sim.cluster.PRESETS
    servers: int = 0  # 0: the preset's count
    noise: float = 0.1  # per job and slot speed noise, as in the simulator
    seed: int = 0
    speed_model: str = "measured"
    pace: bool = False  # true: wait slot_seconds of wall time per slot; false: run slots back to back
    state_file: str = ""  # default <state_dir>/sim-cluster.json (the simulated cluster survives restarts)
    # training time a job loses when it is started or resized (an all-reduce job also when it moves: a
    # checkpoint-restart), as the simulator's resize_overhead_s; the demo's today world sets 30 s
    resize_overhead_s: float = 0.0
    # an all-reduce job spread over servers trains this much slower while one of them holds another such job
    shared_node_slowdown: float = 0.0


@dataclass(frozen=True)
class PolicySection:
    name: str = "elastic-chooser"  # one of POLICIES; the recommended policy (docs/BENCHMARKS.md, "Which policy to run")
    checkpoint: str = ""  # dl2: trained policy (dl2ctl train), required unless allow_untrained; chic/chic-pair: required
    placement: str = "balance"  # balance | dltap (dl2d.policy.seeds.dltap.with_dltap around the policy)
    allow_untrained: bool = False  # dl2 without a checkpoint: random initial parameters (tests, benchmarks)
    online_rl: bool = False  # learn from every slot's reward (DL2 section 4.2)
    checkpoint_every: int = 10  # slots between saves of the online policy
    save_path: str = ""  # default <state_dir>/policy-online.msgpack; loaded at start when present
    online_window: int = 8  # dl2-target online: slots per update and per check of the revert rule
    revert_margin: float = 0.2  # dl2-target online: revert when a window scores below 1 - this of the fallback's
    online_temperature: float = 0.5  # dl2-target online: sample from softmax(logits / this); below 1 explores less
    online_explore: str = "every"  # dl2-target online: which jobs sample: every | resizing (those that restart anyway)
    seed: int = 0
    world: str = "today"  # today (a GPU cluster of today) | dl2: the pretrained policy a learned one uses by default
    # a job of more workers than a node holds gets whole nodes (8, 12, ... on 4-GPU nodes): no two multi-node jobs
    # share a node (policies that read it: elastic, dl2-target)
    whole_nodes: bool = False
    # the batch a job submitted with adaptive_batch starts at: "goodput" (the highest goodput on its GPUs, at every
    # restart) or "fixed" (its submitted one, as every other job)
    batch: str = "goodput"


@dataclass(frozen=True)
class AgentsSection:
    nodes: dict[str, str] = field(default_factory=dict)  # node name -> agent URL
    file: str = ""  # extra "node url" lines (# comments allowed)
    token_file: str = "/etc/dl2d/agent.token"
    poll_interval: float = 10.0
    timeout: float = 2.0
    stale_after: int = 3


@dataclass(frozen=True)
class MetricsSection:
    enabled: bool = True
    port: int = 9465  # 0: any free port (logged)
    bind: str = "127.0.0.1"


@dataclass(frozen=True)
class ControlSection:
    """The control socket dl2ctl submits and cancels through (dl2d.daemon.control)."""

    enabled: bool = True
    socket: str = ""  # default <state_dir>/dl2d.sock; the packaged unit uses /run/dl2d/dl2d.sock


@dataclass(frozen=True)
class GuardrailsSection:
    starve_slots: int = 6  # a job left with no worker this many slots in a row, while the fallback would run it
    fallback: str = "elastic"  # the best heuristic of today's world; any of HEURISTICS
    min_resize_slots: int = 0  # a running job keeps a new size this many slots before the next change (0: off)
    min_resize_gain: float = 0.0  # a running job grows only for this predicted relative speed-up (0: off)


@dataclass(frozen=True)
class LimitsSection:
    """What one user may ask of the daemon, as Slurm's association limits do (dl2d.daemon.quota); root is
    exempt. 0 turns a limit off."""

    max_submit_jobs: int = 1000  # a user's jobs pending or running at once (Slurm's MaxSubmitJobs)
    max_pending_jobs: int = 500  # of them waiting to start
    submit_rate: int = 120  # submissions a user may make in a minute
    pending_window: int = 256  # waiting jobs the policy sees each slot, the longest-waiting first


@dataclass(frozen=True)
class DaemonConfig:
    state_dir: str = DEFAULT_STATE_DIR
    db_url: str = ""  # default sqlite:///<state_dir>/dl2d.sqlite
    backend: str = "sim"
    # "enforce": carry the policy's decisions out; "advise": carry out what Slurm alone would do (the `slurm`
    # policy: each job exactly what it asked for, never resized) and record what the policy would have done
    mode: str = "enforce"
    slot_seconds: float = 1200.0
    max_slots: int = 0  # stop after this many slots (0: run until stopped)
    log_level: str = "info"
    admin_group: str = "dl2d-admin"  # who, beside root, may cancel any job and submit for others (control socket)
    retention_every: int = 1  # slots between node-sample retention passes
    # the most workers the daemon gives any job: a job's own max_workers (its submission's; 16 for a PS job,
    # 64 for an all-reduce job where it does not say) is capped by it
    max_workers: int = 64
    sim: SimSection = SimSection()
    slurm: SlurmSection = SlurmSection()  # the Slurm backend's [slurm] table (dl2d.daemon.slurm.settings)
    policy: PolicySection = PolicySection()
    agents: AgentsSection = AgentsSection()
    metrics: MetricsSection = MetricsSection()
    control: ControlSection = ControlSection()
    guardrails: GuardrailsSection = GuardrailsSection()
    limits: LimitsSection = LimitsSection()

    @property
    def database_url(self) -> str:
        from dl2d.db.engine import default_url

        return self.db_url or default_url(self.state_dir)

    @property
    def sim_state_file(self) -> str:
        return self.sim.state_file or str(Path(self.state_dir) / "sim-cluster.json")

    @property
    def policy_save_path(self) -> str:
        return self.policy.save_path or str(Path(self.state_dir) / "policy-online.msgpack")

    @property
    def control_socket(self) -> str:
        return self.control.socket or str(Path(self.state_dir) / "dl2d.sock")

    @property
    def status_file(self) -> str:
        return str(Path(self.state_dir) / "dl2d.status.json")


# ---------------------------------------------------------------------------------------------- checks

def _check(cfg: DaemonConfig) -> list[tuple[str, str]]:
    """(key path, problem) for every invalid value."""
    bad: list[tuple[str, str]] = []

    def need(ok: bool, key: str, msg: str) -> None:
        if not ok:
            bad.append((key, msg))

    need(cfg.backend in BACKENDS, "backend", f"must be one of {', '.join(BACKENDS)}, got {cfg.backend!r}")
    need(cfg.mode in MODES, "mode", f"must be one of {', '.join(MODES)}, got {cfg.mode!r}")
    need(not (cfg.mode == "advise" and cfg.policy.online_rl), "policy.online_rl",
         "online RL learns from the policy's own decisions, which advise mode does not carry out: turn one off")
    need(cfg.slot_seconds > 0, "slot_seconds", f"must be > 0, got {cfg.slot_seconds}")
    need(cfg.max_slots >= 0, "max_slots", f"must be >= 0, got {cfg.max_slots}")
    need(cfg.retention_every >= 1, "retention_every", f"must be >= 1, got {cfg.retention_every}")
    need(1 <= cfg.max_workers <= 256, "max_workers", f"must be in 1..256, got {cfg.max_workers}")
    need(bool(cfg.state_dir), "state_dir", "must not be empty")
    need(cfg.log_level.lower() in ("debug", "info", "warning", "error"), "log_level",
         f"must be debug, info, warning or error, got {cfg.log_level!r}")
    if cfg.db_url:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            make_url(cfg.db_url)
        except ArgumentError:
            bad.append(("db_url", f"not a database URL: {cfg.db_url!r}"))
    s = cfg.sim
    if cfg.backend == "sim":  # the simulated cluster's presets are the simulator's: a Slurm daemon never loads it
        from dl2d.sim.cluster import MAX_SERVERS, PRESETS

        need(s.cluster in PRESETS, "sim.cluster", f"must be one of {', '.join(PRESETS)}, got {s.cluster!r}")
        need(0 <= s.servers <= MAX_SERVERS, "sim.servers",
             f"must be in 0..{MAX_SERVERS} (0: the preset's count), got {s.servers}")
    need(0 <= s.noise < 1, "sim.noise", f"must be in [0, 1), got {s.noise}")
    need(s.speed_model in ("measured", "parametric"), "sim.speed_model",
         f"must be measured or parametric, got {s.speed_model!r}")
    need(0 <= s.resize_overhead_s <= 86400, "sim.resize_overhead_s", f"must be in [0, 86400], got {s.resize_overhead_s}")
    need(0 <= s.shared_node_slowdown < 1, "sim.shared_node_slowdown",
         f"must be in [0, 1), got {s.shared_node_slowdown}")
    p = cfg.policy
    need(p.name in POLICIES, "policy.name", f"must be one of {', '.join(POLICIES)}, got {p.name!r}")
    need(p.checkpoint_every >= 1, "policy.checkpoint_every", f"must be >= 1, got {p.checkpoint_every}")
    need(2 <= p.online_window <= 10000, "policy.online_window", f"must be in [2, 10000], got {p.online_window}")
    need(0 <= p.revert_margin < 1, "policy.revert_margin", f"must be in [0, 1), got {p.revert_margin}")
    need(0 < p.online_temperature <= 10, "policy.online_temperature",
         f"must be in (0, 10], got {p.online_temperature}")
    need(p.online_explore in ONLINE_EXPLORE, "policy.online_explore",
         f"must be one of {', '.join(ONLINE_EXPLORE)}, got {p.online_explore!r}")
    if p.name in POLICIES:
        for option, msg in registry.problems(p.name, policy_options(cfg)):
            bad.append((f"policy.{option}", f"{msg}; set policy.{option}, or policy.name = \"drf\""))
        if p.checkpoint and "checkpoint" not in registry.get(p.name).options:
            users = registry.names(reads="checkpoint")
            bad.append(("policy.checkpoint", f"policy {p.name} reads no checkpoint (it would be ignored): remove "
                        f"policy.checkpoint, or set policy.name to one that uses it ({', '.join(users)})"))
        if p.whole_nodes and "whole_nodes" not in registry.get(p.name).options:
            users = registry.names(reads="whole_nodes")
            bad.append(("policy.whole_nodes", f"policy {p.name} does not give whole nodes (it would be ignored): "
                        f"set policy.whole_nodes = false, or policy.name to one that does ({', '.join(users)})"))
        if p.online_rl and not registry.get(p.name).online:
            online = [n for n, e in registry.entries().items() if e.online]
            bad.append(("policy.online_rl", f"online RL needs policy.name = one that learns online "
                        f"({', '.join(online)}), not {p.name!r}"))
    need(p.world in WORLDS, "policy.world", f"must be one of {', '.join(WORLDS)}, got {p.world!r}")
    need(p.placement in PLACEMENTS, "policy.placement", f"must be one of {', '.join(PLACEMENTS)}, got {p.placement!r}")
    need(p.batch in registry.BATCH_RULES, "policy.batch",
         f"must be one of {', '.join(registry.BATCH_RULES)}, got {p.batch!r}")
    a = cfg.agents
    need(a.poll_interval > 0, "agents.poll_interval", f"must be > 0, got {a.poll_interval}")
    need(a.timeout > 0, "agents.timeout", f"must be > 0, got {a.timeout}")
    need(a.stale_after >= 1, "agents.stale_after", f"must be >= 1, got {a.stale_after}")
    for node, url in a.nodes.items():
        need(isinstance(url, str) and url.startswith("http://"), f"agents.nodes.{node}",
             f"must be an http:// URL, got {url!r}")
    m = cfg.metrics
    need(0 <= m.port <= 65535, "metrics.port", f"must be in 0..65535, got {m.port}")
    if cfg.control.enabled:
        from dl2d.daemon.control import socket_path_problem

        problem = socket_path_problem(cfg.control_socket)
        need(problem is None, "control.socket" if cfg.control.socket else "state_dir",
             f"the control socket {cfg.control_socket!r} {problem}: set control.socket to a shorter path"
             if problem else "")
    need(bool(cfg.admin_group), "admin_group", "must not be empty")
    from dl2d.daemon.slurm.settings import settings_from_section

    try:  # checked whatever the backend: a broken [slurm] table is refused before anything is written
        settings_from_section(cfg.slurm, cfg.state_dir, cfg.policy.placement)
    except ValueError as e:
        key, _, msg = str(e).partition(": ")
        bad.append((key if key.startswith("slurm") else "slurm", msg or str(e)))
    for key in ("max_submit_jobs", "max_pending_jobs", "submit_rate", "pending_window"):
        value = getattr(cfg.limits, key)
        need(0 <= value <= 10_000_000, f"limits.{key}", f"must be in 0..10000000 (0: no limit), got {value}")
    g = cfg.guardrails
    need(g.starve_slots >= 1, "guardrails.starve_slots", f"must be >= 1, got {g.starve_slots}")
    need(g.min_resize_slots >= 0, "guardrails.min_resize_slots", f"must be >= 0, got {g.min_resize_slots}")
    need(0 <= g.min_resize_gain <= 10, "guardrails.min_resize_gain",
         f"must be within [0, 10] (a fraction: 0.1 = 10%), got {g.min_resize_gain}")
    need(g.fallback in HEURISTICS, "guardrails.fallback",
         f"must be a heuristic ({', '.join(HEURISTICS)}), got {g.fallback!r}")
    return bad


def policy_options(cfg: DaemonConfig) -> registry.PolicyOptions:
    """The [policy] section as the registry's options."""
    p = cfg.policy
    return registry.PolicyOptions(checkpoint=p.checkpoint, seed=p.seed, online_rl=p.online_rl,
                                  allow_untrained=p.allow_untrained, resume=cfg.policy_save_path, world=p.world,
                                  fallback=cfg.guardrails.fallback, online_window=p.online_window,
                                  revert_margin=p.revert_margin, online_temperature=p.online_temperature,
                                  online_explore=p.online_explore, whole_nodes=p.whole_nodes)


# ---------------------------------------------------------------------------------------------- parsing

def _type_name(t: Any) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(t, "a table")


def _coerce(value: Any, t: Any, key: str, source: str) -> Any:
    """A TOML value checked against the field type (ints are accepted for floats)."""
    ok = False
    if t is bool:
        ok = isinstance(value, bool)
    elif t is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif t is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok:
            value = float(value)
            if not math.isfinite(value):
                raise ConfigError(f"config error: {key} (from {source}): must be finite, got {value}")
    elif t is str:
        ok = isinstance(value, str)
    else:  # dict[str, ...]
        ok = isinstance(value, Mapping)
        if ok:
            value = dict(value)
    if not ok:
        raise ConfigError(f"config error: {key} (from {source}): must be {_type_name(t)}, "
                          f"got {type(value).__name__} {value!r}")
    return value


def _parse_env_value(raw: str, t: Any, key: str, var: str) -> Any:
    source = f"environment {var}"
    try:
        if t is bool:
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if t is int:
            return int(raw)
        if t is float:
            return _coerce(float(raw), float, key, source)
        if t is str:
            return raw
    except ValueError:
        raise ConfigError(f"config error: {key} (from {source}): must be {_type_name(t)}, got {raw!r}") from None
    raise ConfigError(f"config error: {key} (from {source}): tables cannot be set from the environment")


def _merge(obj: Any, data: Mapping[str, Any], prefix: str, source: str) -> Any:
    if not isinstance(data, Mapping):
        raise ConfigError(f"config error: {prefix.rstrip('.') or '(top level)'} (from {source}): must be a table")
    hints = get_type_hints(type(obj))
    names = {f.name for f in fields(obj)}
    changes: dict[str, Any] = {}
    for key, value in data.items():
        path = prefix + key
        if key not in names:
            raise ConfigError(f"config error: unknown key {path!r} (from {source}); known keys here: "
                              f"{', '.join(sorted(names))}")
        current = getattr(obj, key)
        if is_dataclass(current):
            changes[key] = _merge(current, value, path + ".", source)
        else:
            t = hints[key]
            changes[key] = _coerce(value, t if t in (int, float, bool, str) else dict, path, source)
    return replace(obj, **changes)


def _env_overrides(cfg: DaemonConfig, env: Mapping[str, str]) -> DaemonConfig:
    """Apply DL2D_<KEY> and DL2D_<SECTION>_<KEY> variables (DL2D_CONFIG is the file, not a key)."""
    top_hints = get_type_hints(DaemonConfig)
    known: dict[str, tuple[str, str | None, Any]] = {}
    for f in fields(DaemonConfig):
        val = getattr(cfg, f.name)
        if is_dataclass(val):
            hints = get_type_hints(type(val))
            for sf in fields(val):
                known[f"DL2D_{f.name}_{sf.name}".upper()] = (f.name, sf.name, hints[sf.name])
        elif top_hints[f.name] in (int, float, bool, str):
            known[f"DL2D_{f.name}".upper()] = (f.name, None, top_hints[f.name])
    for var, raw in env.items():
        if not var.startswith("DL2D_") or var in ("DL2D_CONFIG",) or var.startswith("DL2D_DEBUG_") \
                or var.startswith("DL2D_TEST_"):
            continue
        if var not in known:
            # other tools' variables share the prefix (dl2ctl's DL2D_SOCKET, the job contract's DL2D_WORKERS, the
            # test scripts'): ignored; but one a letter or two from a setting is a typo that would be lost silently
            near = difflib.get_close_matches(var, list(known), 1, TYPO_CUTOFF)
            if near:
                raise ConfigError(f"config error: environment variable {var} is not a dl2d setting; did you mean "
                                  f"{near[0]} ({'.'.join(k for k in known[near[0]][:2] if k)})?")
            continue
        section, key, t = known[var]
        path = f"{section}.{key}" if key else section
        value = _parse_env_value(raw, t, path, var)
        if key is None:
            cfg = replace(cfg, **{section: value})
        else:
            cfg = replace(cfg, **{section: replace(getattr(cfg, section), **{key: value})})
    return cfg


def build_config(file_data: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None,
                 overrides: Mapping[str, Any] | None = None, source: str = "config file") -> DaemonConfig:
    """Defaults < file < environment < overrides (a dotted-key mapping from flags, e.g. {"policy.name": "drf"}).

    Pure: raises ConfigError naming the key path and the value's source."""
    cfg = DaemonConfig()
    if file_data:
        cfg = _merge(cfg, file_data, "", source)
    cfg = _env_overrides(cfg, env or {})
    nested: dict[str, Any] = {}
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        cur = nested
        parts = dotted.split(".")
        for p in parts[:-1]:
            cur = cur.setdefault(p, {})
        cur[parts[-1]] = value
    if nested:
        cfg = _merge(cfg, nested, "", "command line")
    problems = _check(cfg)
    if problems:
        key, msg = problems[0]
        more = f" (and {len(problems) - 1} more: {', '.join(k for k, _ in problems[1:])})" if len(problems) > 1 else ""
        raise ConfigError(f"config error: {key}: {msg}{more}")
    return cfg


def read_toml(path: str | Path, required: bool) -> dict[str, Any]:
    try:
        doc = read_toml_file(path)
    except TomlFileError as e:
        raise ConfigError(f"config error: {e}") from None
    if doc is None:
        if required:
            raise ConfigError(f"config error: config file {Path(path)} does not exist")
        return {}
    return doc


def load_config(path: str | None = None, env: Mapping[str, str] | None = None,
                overrides: Mapping[str, Any] | None = None) -> DaemonConfig:
    """Read the TOML file (explicit path, $DL2D_CONFIG, or the default) and build the config."""
    env = dict(os.environ if env is None else env)
    explicit = path or env.get("DL2D_CONFIG")
    file_path = explicit or DEFAULT_CONFIG
    data = read_toml(file_path, required=bool(explicit))
    return build_config(data, env, overrides, source=str(file_path))


def client_view(file_data: Mapping[str, Any] | None, env: Mapping[str, str], source: str = "config file") \
        -> DaemonConfig:
    """The daemon's config as dl2ctl reads it: the same schema (unknown keys, wrong types and env typos are
    the same errors) and the same file < environment order, without the daemon's own checks (a user's
    dl2ctl needs the database, the state dir, the socket and the admin group, not the daemon's checkpoint)."""
    cfg = _merge(DaemonConfig(), file_data, "", source) if file_data else DaemonConfig()
    return _env_overrides(cfg, env)


#: An agents file lists a node a line: 64 KiB lines for thousands of nodes is far more than any has.
MAX_AGENT_FILE_BYTES = 16 << 20


def read_agent_file(path: str | Path) -> dict[str, str]:
    """'node url' per line (blank lines and # comments skipped); ConfigError names the bad line."""
    from dl2d.core.files import InputFileError, read_bounded

    p = Path(path)
    try:
        text = read_bounded(p, MAX_AGENT_FILE_BYTES).decode("utf-8")
    except InputFileError as e:
        raise ConfigError(f"config error: agents.file {e}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config error: agents.file {p}: not UTF-8 text") from None
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2 or not parts[1].startswith("http://"):
            raise ConfigError(f"config error: agents.file {p} line {n}: expected 'NODE http://HOST:PORT', got {line!r}")
        if parts[0] in out:
            raise ConfigError(f"config error: agents.file {p} line {n}: node {parts[0]!r} listed twice")
        out[parts[0]] = parts[1]
    return out


def agent_targets(cfg: DaemonConfig) -> dict[str, str]:
    """All agents: the [agents] nodes table plus the agents file."""
    targets = dict(cfg.agents.nodes)
    if cfg.agents.file:
        for node, url in read_agent_file(cfg.agents.file).items():
            if node in targets and targets[node] != url:
                raise ConfigError(f"config error: agent {node!r} has two URLs: {targets[node]} "
                                  f"(agents.nodes) and {url} (agents.file)")
            targets[node] = url
    return targets
