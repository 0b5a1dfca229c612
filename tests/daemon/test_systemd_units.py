"""The shipped unit files (systemd/): valid for systemd, hardened to an exposure of 5 or better, and fit for a
virtual-environment install. Uses the real systemd-analyze (scripts/test.sh installs it)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "systemd"
ANALYZE = shutil.which("systemd-analyze")


def directives(unit: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in (UNITS / unit).read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, value = line.split("=", 1)
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def analyze(*args: str) -> subprocess.CompletedProcess:
    assert ANALYZE, "systemd-analyze is missing: scripts/test.sh installs the systemd package"
    return subprocess.run([ANALYZE, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("unit, program", [("dl2d.service", "dl2d"), ("dl2-agent.service", "dl2-agent")])
def test_the_unit_verifies_with_the_installed_program(tmp_path, unit, program):
    """systemd-analyze verify, with ExecStart pointed at where this install put the program (what an admin's
    `systemctl edit` drop-in does for a virtual environment)."""
    text = (UNITS / unit).read_text()
    exec_start = directives(unit)["ExecStart"]
    assert len(exec_start) == 1 and exec_start[0].startswith(f"/usr/local/bin/{program} ")  # no /usr/bin/env
    installed = shutil.which(program)
    assert installed, f"{program} is not on PATH (pip install -e . first)"
    (tmp_path / unit).write_text(text.replace(f"/usr/local/bin/{program} ", f"{installed} "))
    r = analyze("verify", str(tmp_path / unit))
    assert r.returncode == 0 and not r.stderr.strip(), r.stderr


#: systemd-analyze security's figure of each unit as shipped (docs/daemon.md): the daemon's rose from 1.5 to 2.6
#: when it became root to run jobs as their owners (User=, PrivateUsers=, the five capabilities, @privileged).
EXPOSURE = {"dl2d.service": 2.6, "dl2-agent.service": 2.8}


@pytest.mark.parametrize("unit", ["dl2d.service", "dl2-agent.service"])
def test_exposure_is_five_or_better(unit):
    r = analyze("security", "--offline=true", "--no-pager", str(UNITS / unit))
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", r.stdout)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= min(5.0, EXPOSURE[unit]), r.stdout


@pytest.mark.parametrize("unit, condition", [("dl2d.service", "/etc/dl2d/dl2d.toml"),
                                             ("dl2-agent.service", "/etc/dl2d/agent.token")])
def test_the_unit_waits_for_its_config_and_reads_an_environment_file(unit, condition):
    d = directives(unit)
    assert d["ConditionPathExists"] == [condition]
    assert any(v.startswith("-/etc/default/") for v in d["EnvironmentFile"])  # optional: "-"


def test_the_daemon_and_the_agent_keep_only_the_capabilities_they_need():
    """The daemon runs as root to run each job as its owner: it switches to the job's user to
    submit it, gives the job its directory and reads what the job wrote there; nothing more. Without PrivateUsers
    (a namespace mapping root alone could do none of that) and with @setuid/@chown, but no other privileged
    system call."""
    d = directives("dl2d.service")
    assert "User" not in d and "PrivateUsers" not in d
    assert d["CapabilityBoundingSet"] == ["CAP_SETUID CAP_SETGID CAP_CHOWN CAP_DAC_OVERRIDE CAP_FOWNER"]
    assert d["SystemCallFilter"] == ["@system-service",
                                     "~@clock @cpu-emulation @debug @module @mount @obsolete @raw-io @reboot @swap"]
    assert d["NoNewPrivileges"] == ["yes"] and d["StateDirectoryMode"] == ["0711"]  # jobs pass through, never list
    assert directives("dl2-agent.service")["CapabilityBoundingSet"] == ["CAP_SYS_PTRACE CAP_DAC_READ_SEARCH"]
    # the daemon's policy is compiled by JAX at run time: writable executable memory must stay allowed
    assert "MemoryDenyWriteExecute" not in directives("dl2d.service")


def test_the_agent_listens_where_the_admin_says_and_on_loopback_otherwise():
    """The agent speaks plain HTTP: the unit passes --bind from DL2_AGENT_BIND (the admin's
    /etc/default/dl2-agent, an example of which is shipped), with loopback as the unit's default, never
    0.0.0.0; the agent's own default is loopback too, and it refuses an empty address (every address)."""
    from click.testing import CliRunner

    from dl2d.agents.main import DEFAULT_BIND, bind_problem, main

    d = directives("dl2-agent.service")
    assert "--bind ${DL2_AGENT_BIND} " in d["ExecStart"][0] and "0.0.0.0" not in d["ExecStart"][0]
    assert d["Environment"] == ["DL2_AGENT_BIND=127.0.0.1"]
    assert d["EnvironmentFile"] == ["-/etc/default/dl2-agent"]  # read after Environment=: the admin's wins
    example = (UNITS / "dl2-agent.default.example").read_text()
    assert re.search(r"^#?DL2_AGENT_BIND=\d+\.\d+\.\d+\.\d+$", example, re.M), example
    assert "0.0.0.0" not in re.findall(r"^#?DL2_AGENT_BIND=(.*)$", example, re.M)
    assert DEFAULT_BIND == "127.0.0.1" and bind_problem("10.1.0.17") is None and bind_problem(" ")
    r = CliRunner().invoke(main, ["--bind", "", "--token-file", "/nonexistent"])
    assert r.exit_code == 2 and "--bind is empty (it would listen on every address)" in r.output, r.output
