"""The defaults the docs and the example config state are the code's: docs/daemon.md's key table, the values
its "Running on Slurm" block and systemd/dl2d.toml.example give, docs/jobs.md's checkpoint deadline, and the
demo options "Try it" names, each against dl2d.daemon.config's dataclasses (DaemonConfig and its sections, the
[slurm] table's SlurmSection) and dl2d's flags. A default changed in the code, or a doc that says another,
fails here instead of misleading an admin."""
from __future__ import annotations

import re
import tomllib
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

import pytest

from dl2d.daemon.config import DaemonConfig, build_config, client_view
from dl2d.daemon.slurm.settings import SlurmSection

REPO = Path(__file__).resolve().parents[2]
DAEMON_DOC = (REPO / "docs" / "daemon.md").read_text()
EXAMPLE = REPO / "systemd" / "dl2d.toml.example"
DEFAULTS = DaemonConfig()
#: What the example config sets on purpose to something else than the built-in default (it is a Slurm site's).
EXAMPLE_CHOICES = {"backend": "slurm"}


def section(doc: str, heading: str) -> str:
    """The text of the `## heading` section, up to the next `## `."""
    start = doc.index(f"## {heading}\n")
    end = doc.find("\n## ", start + 1)
    return doc[start:end if end > 0 else None]


def default_of(key: str) -> Any:
    """The dataclass default of a dotted key ("policy.name"); KeyError for a key the config does not have."""
    obj: Any = DEFAULTS
    for part in key.split("."):
        if not is_dataclass(obj) or part not in {f.name for f in fields(obj)}:
            raise KeyError(key)
        obj = getattr(obj, part)
    return obj


#: Keys whose dataclass default is "" and whose effective default a property of DaemonConfig computes
EFFECTIVE = {"db_url": lambda c: c.database_url, "control.socket": lambda c: c.control_socket,
             "policy.save_path": lambda c: c.policy_save_path, "sim.state_file": lambda c: c.sim_state_file}


def doc_value(text: str) -> Any:
    """A default cell of the key table as a value: `x` / x, numbers, true/false, {} and the empty cell;
    a trailing "(off)"-like note is dropped; `<state_dir>` stands for the default state dir."""
    t = re.sub(r"\s*\([^)]*\)$", "", text.strip()).strip("`")
    if t in ("", "{}"):
        return {} if t == "{}" else ""
    if t in ("true", "false"):
        return t == "true"
    if re.fullmatch(r"-?\d+(\.\d+)?", t):
        return float(t)
    return t.replace("<state_dir>", DEFAULTS.state_dir)


def key_table_rows() -> list[tuple[str, str]]:
    """(dotted key, stated default) of docs/daemon.md's configuration table; a row of several keys split."""
    rows = []
    for line in section(DAEMON_DOC, "Configuration").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| `") or len(cells) < 3 or cells[0].startswith("`["):
            continue
        keys = [k.strip().strip("`") for k in cells[0].split(" / ")]
        values = [v.strip() for v in cells[1].split(" / ")] if len(keys) > 1 else [cells[1]]
        assert len(keys) == len(values), line
        rows.extend(zip(keys, values))
    return rows


def same(stated: Any, actual: Any) -> bool:
    if isinstance(stated, float) and not isinstance(actual, bool):
        return isinstance(actual, (int, float)) and float(actual) == stated
    return stated == actual


def test_the_key_table_has_rows_to_check():
    keys = [k for k, _ in key_table_rows()]
    assert len(keys) >= 40 and "policy.name" in keys and "metrics.port" in keys, keys


@pytest.mark.parametrize("key,stated", key_table_rows())
def test_every_default_in_the_key_table_is_the_codes(key, stated):
    if key == "db_url":
        assert stated == "SQLite in `state_dir`"
        assert DEFAULTS.database_url == f"sqlite:///{DEFAULTS.state_dir}/dl2d.sqlite"
        return
    value = doc_value(stated)
    actual = EFFECTIVE[key](DEFAULTS) if key in EFFECTIVE else default_of(key)
    assert same(value, actual), f"docs/daemon.md says {key} defaults to {stated}; the code's default is {actual!r}"


def test_the_slurm_blocks_values_that_are_defaults_are_the_codes():
    """The block an admin copies: the values it gives for these keys are the built-in ones (the others are a
    site's choices: a partition, a shared state dir, a time limit)."""
    block = re.search(r"```toml\n(.*?)```", section(DAEMON_DOC, "Running on Slurm"), re.S)[1]
    table = tomllib.loads(block)["slurm"]
    client_view(tomllib.loads(block), {})  # every key is one of SlurmSection's, of the right type
    section_defaults = SlurmSection()
    for key in ("driver", "restart_method", "checkpoint_signal", "checkpoint_timeout_s", "done_grace_s",
                "job_name_prefix", "run_jobs_as"):
        assert same(table[key], getattr(section_defaults, key)), key


def commented_settings(text: str) -> list[tuple[str, str, str]]:
    """(section, key, TOML value) of the example's commented-out `# key = value` lines."""
    out, current = [], ""
    for line in text.splitlines():
        if m := re.match(r"^\[([a-z_.]+)\]", line):
            current = m[1]
        elif m := re.match(r"^#\s?([a-z_0-9]+) = (.+?)(?:\s+#.*)?$", line):
            out.append((current, m[1], m[2]))
    return out


def test_the_example_config_loads_and_what_it_sets_is_the_default_unless_chosen():
    text = EXAMPLE.read_text()
    doc = tomllib.loads(text)
    cfg = build_config(doc, {})  # every key known, every value valid

    def leaves(d: dict, prefix: str = ""):
        for k, v in d.items():
            if isinstance(v, dict) and is_dataclass(default_of(prefix + k)):
                yield from leaves(v, prefix + k + ".")
            else:
                yield prefix + k, v

    for key, value in leaves(doc):
        if key in EXAMPLE_CHOICES:
            assert value == EXAMPLE_CHOICES[key]
            continue
        assert same(value, default_of(key)), f"the example sets {key} = {value!r}; the default is {default_of(key)!r}"
    assert cfg.slurm.checkpoint_timeout_s == SlurmSection().checkpoint_timeout_s


def test_every_commented_out_setting_of_the_example_is_a_key_of_the_right_type():
    settings = commented_settings(EXAMPLE.read_text())
    assert len(settings) >= 15, settings
    for table, key, value in settings:
        parsed = tomllib.loads(f"v = {value}")["v"]
        doc: dict = {key: parsed}
        for part in reversed(table.split(".") if table else []):
            doc = {part: doc}
        client_view(doc, {})  # ConfigError: an unknown key, or a value of the wrong type


def test_the_example_names_the_learned_policies_that_ship():
    """A fresh install runs the shipped learned policies without a checkpoint of its own."""
    text = EXAMPLE.read_text()
    from dl2d.policy import registry

    for name in ("dl2-target", "elastic-chooser"):
        assert f'name = "{name}"' in text
        build_config({"policy": {"name": name}}, {})  # needs no policy.checkpoint
        assert "checkpoint" not in [o for o, _ in registry.problems(name, registry.PolicyOptions())]
    assert "a fresh install does not have" not in text


def test_jobs_md_states_the_checkpoint_deadline_the_code_has():
    jobs = (REPO / "docs" / "jobs.md").read_text()
    stated = re.findall(r"`\[slurm\] checkpoint_timeout_s`, default (\d+)", jobs)
    assert stated and all(float(s) == SlurmSection().checkpoint_timeout_s for s in stated), stated


def test_the_demo_options_of_try_it_are_dl2ds():
    from dl2d.daemon.main import main
    from dl2d.sim.cluster import PRESETS

    try_it = section(DAEMON_DOC, "Try it")
    flags = {o for p in main.params for o in p.opts + p.secondary_opts}
    named = set(re.findall(r"`(--[a-z-]+)", try_it))
    assert named and named <= flags, named - flags
    clusters = set(re.findall(r"`(t4-\d+|tiny|small|testbed|dl2)`", try_it))
    assert clusters == set(PRESETS), clusters ^ set(PRESETS)
    assert "40-server" not in try_it  # the DL2 world's cluster is not the default demo's
