"""Config: defaults, file < env < flags, and clear errors naming the key path and the value's source."""
from __future__ import annotations

import pytest

from dl2d.daemon.config import ConfigError, agent_targets, build_config, load_config, read_agent_file


def test_defaults_are_valid_and_documented_values():
    c = build_config()
    assert c.backend == "sim" and c.slot_seconds == 1200 and c.policy.name == "elastic-chooser"
    assert c.database_url.endswith("/dl2d.sqlite") and c.database_url.startswith("sqlite:///")
    assert c.metrics.port == 9465 and c.agents.stale_after == 3 and c.guardrails.fallback == "elastic"


def test_precedence_file_env_flags():
    file = {"slot_seconds": 600, "policy": {"name": "tetris"}, "sim": {"cluster": "tiny"}}
    env = {"DL2D_SLOT_SECONDS": "30", "DL2D_SIM_CLUSTER": "testbed", "DL2D_POLICY_ONLINE_RL": "false",
           "DL2D_UNRELATED": "x", "DL2D_CONFIG": "/nope"}
    c = build_config(file, env, {"sim.cluster": "small", "policy.name": None})
    assert c.slot_seconds == 30.0  # env beats file
    assert c.sim.cluster == "small"  # flag beats env
    assert c.policy.name == "tetris"  # None flag = not given


@pytest.mark.parametrize("data, where, what", [
    ({"slot_secs": 5}, "'slot_secs'", "unknown key"),
    ({"policy": {"nmae": "drf"}}, "'policy.nmae'", "unknown key"),
    ({"slot_seconds": "fast"}, "slot_seconds", "must be a number"),
    ({"slot_seconds": 0}, "slot_seconds", "must be > 0"),
    ({"metrics": {"port": 70000}}, "metrics.port", "0..65535"),
    ({"policy": {"name": "dl3"}}, "policy.name", "must be one of"),
    ({"policy": {"name": "dl2"}}, "policy.checkpoint", "needs a trained checkpoint"),
    ({"policy": {"online_rl": True}}, "policy.online_rl", "needs policy.name"),
    ({"policy": {"world": "mars"}}, "policy.world", "must be one of today, dl2"),
    ({"policy": {"online_explore": "some"}}, "policy.online_explore", "must be one of every, resizing"),
    ({"policy": {"name": "drf", "whole_nodes": True}}, "policy.whole_nodes", "does not give whole nodes"),
    ({"policy": {"name": "elastic", "whole_nodes": "yes"}}, "policy.whole_nodes", "true or false"),
    ({"agents": {"stale_after": 0}}, "agents.stale_after", ">= 1"),
    ({"agents": {"nodes": {"n1": "ftp://x"}}}, "agents.nodes.n1", "http://"),
    ({"sim": {"noise": 1.5}}, "sim.noise", "[0, 1)"),
    ({"guardrails": {"fallback": "dl2"}}, "guardrails.fallback", "heuristic"),
    ({"policy": 3}, "policy", "must be a table"),
    ({"metrics": {"enabled": "yes"}}, "metrics.enabled", "true or false"),
])
def test_bad_values_name_the_key(data, where, what):
    with pytest.raises(ConfigError) as e:
        build_config(data, source="/etc/dl2d/dl2d.toml")
    assert where in str(e.value) and what in str(e.value)


def test_whole_nodes_reach_the_policies_that_give_them():
    from dl2d.daemon.config import policy_options
    from dl2d.policy import registry

    for name in ("elastic", "dl2-target"):
        c = build_config({"policy": {"name": name, "whole_nodes": True}})
        assert policy_options(c).whole_nodes and "whole_nodes" in registry.get(name).options
    assert not policy_options(build_config({"policy": {"name": "elastic"}})).whole_nodes


def test_env_errors_name_the_variable():
    with pytest.raises(ConfigError, match=r"agents.stale_after \(from environment DL2D_AGENTS_STALE_AFTER\)"):
        build_config({}, {"DL2D_AGENTS_STALE_AFTER": "three"})
    with pytest.raises(ConfigError, match="DL2D_METRICS_ENABLED"):
        build_config({}, {"DL2D_METRICS_ENABLED": "maybe"})


def test_load_config_file(tmp_path):
    p = tmp_path / "dl2d.toml"
    p.write_text('state_dir = "/srv/dl2d"\nbackend = "sim"\n[sim]\ncluster = "tiny"\n[agents.nodes]\nn1 = "http://n1:9464"\n')
    c = load_config(str(p), env={})
    assert c.state_dir == "/srv/dl2d" and c.sim.cluster == "tiny" and c.agents.nodes == {"n1": "http://n1:9464"}
    assert c.sim_state_file == "/srv/dl2d/sim-cluster.json"
    # a named file must exist; the default one may be absent
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "missing.toml"), env={})
    (tmp_path / "bad.toml").write_text("slot_seconds = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(str(tmp_path / "bad.toml"), env={})
    with pytest.raises(ConfigError, match="unknown key 'bogus' \\(from .*via-env.toml\\)"):
        (tmp_path / "via-env.toml").write_text("bogus = 1")
        load_config(None, env={"DL2D_CONFIG": str(tmp_path / "via-env.toml")})


def test_agent_file(tmp_path):
    f = tmp_path / "agents"
    f.write_text("# nodes\ngpu01 http://10.0.0.1:9464\n\ngpu02 http://10.0.0.2:9464  # rack 2\n")
    assert read_agent_file(f) == {"gpu01": "http://10.0.0.1:9464", "gpu02": "http://10.0.0.2:9464"}
    c = build_config({"agents": {"file": str(f), "nodes": {"gpu03": "http://10.0.0.3:9464"}}})
    assert set(agent_targets(c)) == {"gpu01", "gpu02", "gpu03"}
    f.write_text("gpu01\n")
    with pytest.raises(ConfigError, match="line 1"):
        read_agent_file(f)
    f.write_text("gpu01 http://a:1\ngpu01 http://b:1\n")
    with pytest.raises(ConfigError, match="listed twice"):
        read_agent_file(f)


def test_shipped_example_config_is_valid():
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "systemd" / "dl2d.toml.example"
    c = load_config(str(example), env={})
    # a fresh install has no checkpoint of its own: the example runs the recommended policy, whose parameters ship
    assert c.backend == "slurm" and c.policy.name == "elastic-chooser" and not c.policy.checkpoint
    from dl2d.policy import registry
    assert registry.build(c.policy.name).name == "elastic-chooser"
    assert c.metrics.bind == "127.0.0.1"  # the unauthenticated metrics endpoint stays on loopback
    unit = (example.parent / "dl2d.service").read_text()
    writable = [line.split("=", 1)[1].split() for line in unit.splitlines() if line.startswith("ReadWritePaths=")]
    assert any(c.state_dir in paths for paths in writable)  # the unit lets the daemon write its state dir
