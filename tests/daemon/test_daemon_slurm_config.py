"""`backend = "slurm"`: the [slurm] table of dl2d.toml builds a real SlurmBackend (CLI driver with the
table's SLURM_CONF, backend settings, backoff), and bad tables are config errors naming the key: its keys
and types are checked with the rest of the config (dl2d/daemon/config.py), its values when the backend is
built (dl2d.daemon.slurm.settings)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dl2d.daemon.config import ConfigError, build_config, load_config
from dl2d.daemon.main import make_backend
from dl2d.daemon.slurm.backend import SlurmBackend
from dl2d.daemon.slurm.mapping import NodeShape
from dl2d.daemon.slurm.settings import SlurmSection, settings_from_section
from dl2d.slurm.backoff import BackoffPolicy, RetryingDriver
from dl2d.slurm.cli_driver import CliDriver


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "dl2d.toml"
    p.write_text(text)
    return p


def test_slurm_table_builds_the_backend(tmp_path):
    cfg_file = write(tmp_path, f"""
state_dir = "{tmp_path / 'state'}"
backend = "slurm"
slot_seconds = 5
[slurm]
slurm_conf = "{tmp_path / 'slurm.conf'}"
command_timeout_s = 7
restart_method = "requeue"
checkpoint_timeout_s = 20
job_name_prefix = "t-"
time_limit_min = 30
workdir = "{tmp_path}"
node_shape = {{ gpus = 4, cpus = 16, mem_gb = 15.5 }}
backoff = {{ base = 0.1, cap = 1.0, max_attempts = 3 }}
""")
    cfg = load_config(str(cfg_file), env={})
    b = make_backend(cfg)
    assert isinstance(b, SlurmBackend)
    assert isinstance(b.raw_driver, CliDriver) and isinstance(b.driver, RetryingDriver)
    assert b.raw_driver.env == {"SLURM_CONF": str(tmp_path / "slurm.conf")} and b.raw_driver.timeout == 7.0
    c = b.config
    assert c.state_dir == tmp_path / "state" / "slurm"  # default: under the daemon's state dir
    assert (c.state_dir / "jobs").is_dir()
    assert (c.restart_method, c.checkpoint_timeout_s, c.job_name_prefix, c.time_limit_min, c.workdir) == (
        "requeue", 20, "t-", 30, str(tmp_path))
    assert c.node_shape == NodeShape(4, 16, 15.5)
    assert c.backoff == BackoffPolicy(base=0.1, cap=1.0, max_attempts=3)
    assert b.driver.policy == c.backoff


def test_empty_slurm_table_uses_defaults(tmp_path):
    kind, options, c = settings_from_section(SlurmSection(), tmp_path)
    assert (kind, options) == ("cli", {})
    assert c.state_dir == tmp_path / "slurm" and c.restart_method == "resubmit" and c.placement == "slurm"
    assert (c.partition, c.time_limit_min, c.workdir, c.node_shape) == (None, None, None, None)
    _, _, c = settings_from_section(SlurmSection(state_dir=str(tmp_path / "shared")), tmp_path)
    assert c.state_dir == tmp_path / "shared"
    assert settings_from_section(SlurmSection(), tmp_path, policy_placement="dltap")[2].placement == "target"


def slurm_config(tmp_path: Path, table: dict):
    return build_config({"state_dir": str(tmp_path), "backend": "slurm", "slurm": table}, {}, source="dl2d.toml")


@pytest.mark.parametrize("table, match", [
    ({"restart": "requeue"}, "unknown key 'slurm.restart' \\(from dl2d.toml\\)"),
    ({"checkpoint_timeout_s": "20"}, "slurm.checkpoint_timeout_s \\(from dl2d.toml\\): must be a number"),
    ({"time_limit_min": True}, "slurm.time_limit_min \\(from dl2d.toml\\): must be an integer"),
    ({"node_shape": 4}, "slurm.node_shape \\(from dl2d.toml\\): must be a table"),
])
def test_unknown_keys_and_wrong_types_are_config_errors_when_the_config_is_read(tmp_path, table, match):
    with pytest.raises(ConfigError, match=match):
        slurm_config(tmp_path, table)


@pytest.mark.parametrize("table, match", [
    ({"restart_method": "reboot"}, "restart_method must be one of"),
    ({"checkpoint_timeout_s": 0}, "slurm.checkpoint_timeout_s: must be > 0"),
    ({"time_limit_min": -1}, "slurm.time_limit_min: must be >= 0"),
    ({"driver": "rest"}, "slurm.driver: must be one of cli, pyslurm"),
    ({"driver": "pyslurm", "slurm_conf": "/x"}, "slurm.slurm_conf / slurm.command_timeout_s: only for driver"),
    ({"node_shape": {"gpus": 4}}, "slurm.node_shape: needs exactly"),
    ({"node_shape": {"gpus": 4, "cpus": "16", "mem_gb": 64}}, "slurm.node_shape.cpus: must be a number"),
    ({"backoff": {"retries": 3}}, "slurm.backoff.retries: unknown key"),
    ({"backoff": {"factor": 0.5}}, "slurm.backoff: invalid backoff"),
    ({"command_timeout_s": -1}, "slurm.command_timeout_s: must be > 0"),
    ({"checkpoint_signal": "USR9"}, "checkpoint_signal: 'USR9' is not a signal name or number"),
    ({"checkpoint_signal": "SIGKILL"}, "checkpoint_signal: 'SIGKILL' cannot be caught by a job"),
])
def test_bad_slurm_values_are_config_errors_when_the_config_is_read(tmp_path, table, match):
    """Refused by the config check, not when the backend is built after the database was
    created and migrated, and whatever the backend: settings_from_section is the one validator of [slurm]."""
    with pytest.raises(ConfigError, match=f"config error: (slurm: )?{match}"):
        slurm_config(tmp_path, table)
    with pytest.raises(ConfigError, match=f"config error: (slurm: )?{match}"):
        build_config({"backend": "sim", "slurm": table}, {})


def test_slurm_keys_from_the_environment(tmp_path):
    cfg = build_config({"backend": "slurm", "slurm": {"partition": "cpu"}},
                       {"DL2D_SLURM_PARTITION": "gpu", "DL2D_SLURM_CHECKPOINT_TIMEOUT_S": "30"})
    assert (cfg.slurm.partition, cfg.slurm.checkpoint_timeout_s) == ("gpu", 30.0)
    with pytest.raises(ConfigError, match="slurm.node_shape .*tables cannot be set from the environment"):
        build_config({}, {"DL2D_SLURM_NODE_SHAPE": "4"})


def test_dl2d_exits_2_naming_the_bad_slurm_key(tmp_path):
    cfg_file = write(tmp_path, f'state_dir = "{tmp_path}"\nbackend = "slurm"\n[slurm]\nrestart_methd = "requeue"\n')
    r = subprocess.run([sys.executable, "-m", "dl2d.daemon.main", "--config", str(cfg_file), "--no-metrics"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert f"unknown key 'slurm.restart_methd' (from {cfg_file})" in r.stderr


def test_documented_slurm_tables_are_valid(tmp_path):
    """The [slurm] examples in docs/daemon.md and systemd/dl2d.toml.example build."""
    import re
    import tomllib

    repo = Path(__file__).resolve().parents[2]
    doc = (repo / "docs" / "daemon.md").read_text()
    block = re.search(r"```toml\n(.*?)```", doc[doc.index("## Running on Slurm"):], re.S)[1]
    example = tomllib.loads((repo / "systemd" / "dl2d.toml.example").read_text())
    for table in (tomllib.loads(block)["slurm"], example["slurm"]):
        kind, _, c = settings_from_section(slurm_config(tmp_path, table).slurm, tmp_path)
        assert kind == "cli" and c.checkpoint_timeout_s == 120
