"""`backend = "slurm"`: the [slurm] table of dl2d.toml builds a real SlurmBackend (CLI driver with the
table's SLURM_CONF, backend settings, backoff), and bad tables are config errors naming the key."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dl2d.daemon.config import ConfigError, load_config
from dl2d.daemon.main import make_backend
from dl2d.daemon.slurm_backend import NodeShape, SlurmBackend, settings_from_table
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
    kind, options, c = settings_from_table({}, tmp_path)
    assert (kind, options) == ("cli", {})
    assert c.state_dir == tmp_path / "slurm" and c.restart_method == "resubmit"
    _, _, c = settings_from_table({"state_dir": str(tmp_path / "shared")}, tmp_path)
    assert c.state_dir == tmp_path / "shared"


@pytest.mark.parametrize("table, match", [
    ({"restart": "requeue"}, "slurm.restart: unknown key"),
    ({"restart_method": "reboot"}, "restart_method must be one of"),
    ({"checkpoint_timeout_s": "20"}, "slurm.checkpoint_timeout_s: wrong type"),
    ({"checkpoint_timeout_s": 0}, "slurm.checkpoint_timeout_s: must be > 0"),
    ({"time_limit_min": True}, "slurm.time_limit_min: wrong type"),
    ({"driver": "rest"}, "slurm.driver: must be one of cli, pyslurm"),
    ({"driver": "pyslurm", "slurm_conf": "/x"}, "only for driver"),
    ({"node_shape": {"gpus": 4}}, "slurm.node_shape: needs exactly"),
    ({"backoff": {"retries": 3}}, "slurm.backoff.retries: unknown key"),
    ({"backoff": {"factor": 0.5}}, "slurm.backoff: invalid backoff"),
    ({"command_timeout_s": -1}, "slurm.command_timeout_s: must be > 0"),
])
def test_bad_slurm_tables_are_config_errors(tmp_path, table, match):
    with pytest.raises(ValueError, match=match):
        settings_from_table(table, tmp_path)
    cfg = load_config(str(write(tmp_path, f'state_dir = "{tmp_path}"\nbackend = "slurm"\n')), env={})
    cfg = type(cfg)(**{**cfg.__dict__, "slurm": table})
    with pytest.raises(ConfigError, match="config error: slurm"):
        make_backend(cfg)


def test_dl2d_exits_2_naming_the_bad_slurm_key(tmp_path):
    cfg_file = write(tmp_path, f'state_dir = "{tmp_path}"\nbackend = "slurm"\n[slurm]\nrestart_methd = "requeue"\n')
    r = subprocess.run([sys.executable, "-m", "dl2d.daemon.main", "--config", str(cfg_file), "--no-metrics"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "slurm.restart_methd: unknown key" in r.stderr


def test_documented_slurm_tables_are_valid(tmp_path):
    """The [slurm] examples in docs/daemon.md and systemd/dl2d.toml.example build."""
    import re
    import tomllib

    repo = Path(__file__).resolve().parents[2]
    doc = (repo / "docs" / "daemon.md").read_text()
    block = re.search(r"```toml\n(.*?)```", doc[doc.index("## Running on Slurm"):], re.S)[1]
    example = tomllib.loads((repo / "systemd" / "dl2d.toml.example").read_text())
    for table in (tomllib.loads(block)["slurm"], example["slurm"]):
        kind, _, c = settings_from_table(table, tmp_path)
        assert kind == "cli" and c.checkpoint_timeout_s == 120
