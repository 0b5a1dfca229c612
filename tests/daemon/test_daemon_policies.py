"""The issue-7 policies in the daemon: chic / chic-pair (from a Chic checkpoint), dual-agent, and
policy.placement = "dltap" around any policy. Config validation, and short runs of the real slot loop on the
simulated backend with SQLite: every job finishes, the policy (not the fallback) decided, under its name."""
from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from dl2d.daemon.config import ConfigError, build_config
from dl2d.daemon.main import DemoFeeder, build_loop, make_policy
from dl2d.db.engine import session_scope
from dl2d.db.models import Decision, Job, JobState
from dl2d.policy.seeds import chic
from dl2d.policy.seeds.dltap import DLTAP

SHORT_TYPES = ("resnext-110", "wlm", "dssm", "resnet-50")


def chic_checkpoint(path, pair: bool = False):
    """A tiny untrained Chic network: enough to run the daemon, not to schedule well."""
    cfg = chic.ChicConfig(pair=pair, hidden=(8,))
    chic.save_checkpoint(path, cfg, chic.init_params(cfg, seed=0))
    return str(path)


def config(tmp_path, policy: dict, **kw):
    base = {"state_dir": str(tmp_path), "sim": {"cluster": "tiny", "noise": 0.0, "seed": 3},
            "metrics": {"enabled": False}, "policy": policy, **kw}
    return build_config(base, {})


# ------------------------------------------------------------------------------------------- config

@pytest.mark.parametrize("policy", [{"name": "dual-agent"}, {"name": "drf", "placement": "dltap"},
                                    {"name": "chic", "checkpoint": "x.npz", "placement": "balance"},
                                    {"name": "chic-pair", "checkpoint": "x.npz", "placement": "dltap"}])
def test_new_policy_names_and_placement_are_valid(tmp_path, policy):
    c = config(tmp_path, policy)
    assert c.policy.name == policy["name"] and c.policy.placement == policy.get("placement", "balance")


def test_placement_from_the_environment(tmp_path):
    c = build_config({"state_dir": str(tmp_path)}, {"DL2D_POLICY_PLACEMENT": "dltap"})
    assert c.policy.placement == "dltap"


@pytest.mark.parametrize("policy, where, what", [
    ({"name": "chic"}, "policy.checkpoint", "needs a trained Chic checkpoint"),
    ({"name": "chic-pair"}, "policy.checkpoint", "needs a trained Chic checkpoint"),
    ({"name": "drf", "placement": "pack"}, "policy.placement", "must be one of balance, dltap"),
    ({"name": "dual-agent", "online_rl": True}, "policy.online_rl", "needs policy.name"),
])
def test_bad_policy_settings_name_the_key(tmp_path, policy, where, what):
    with pytest.raises(ConfigError) as e:
        config(tmp_path, policy)
    assert where in str(e.value) and what in str(e.value)


@pytest.mark.parametrize("fallback", ["chic", "dual-agent", "dl2"])
def test_fallback_must_be_a_heuristic(tmp_path, fallback):
    with pytest.raises(ConfigError, match="guardrails.fallback: must be a heuristic"):
        config(tmp_path, {"name": "drf"}, guardrails={"fallback": fallback})


def test_missing_or_wrong_chic_checkpoint_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"policy.checkpoint: .*no such checkpoint"):
        make_policy(config(tmp_path, {"name": "chic", "checkpoint": str(tmp_path / "none.npz")}))
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match=r"policy.checkpoint: .*not a Chic checkpoint"):
        make_policy(config(tmp_path, {"name": "chic", "checkpoint": str(garbage)}))
    plain = chic_checkpoint(tmp_path / "chic.npz", pair=False)
    with pytest.raises(ConfigError, match=r"is a chic checkpoint, policy.name is 'chic-pair'"):
        make_policy(config(tmp_path, {"name": "chic-pair", "checkpoint": plain}))


def test_make_policy_builds_and_wraps(tmp_path):
    pair = chic_checkpoint(tmp_path / "pair.npz", pair=True)
    pol, learner = make_policy(config(tmp_path, {"name": "chic-pair", "checkpoint": pair}))
    assert isinstance(pol, chic.ChicScheduler) and pol.cfg.pair and pol.name == "chic-pair" and learner is None
    pol, _ = make_policy(config(tmp_path, {"name": "chic-pair", "checkpoint": pair, "placement": "dltap"}))
    assert isinstance(pol, DLTAP) and pol.name == "chic-pair+dltap" and pol.inner.cfg.pair
    pol, _ = make_policy(config(tmp_path, {"name": "dual-agent"}))
    assert pol.name == "dual-agent"


# ------------------------------------------------------------------------------------------- daemon runs

def run_daemon(cfg, jobs: int = 6):
    feeder = DemoFeeder(jobs, seed=5, job_types=SHORT_TYPES, world="dl2")
    loop = build_loop(cfg, feeder)
    slots = loop.run(max_slots=400, until_idle=lambda: feeder.exhausted() and loop.idle())
    with session_scope(loop.engine) as s:
        states = [j.state for j in s.scalars(select(Job).order_by(Job.id))]
        sources = [(d.source.value, d.fallback_reason or "") for d in s.scalars(select(Decision))]
    with open(cfg.status_file) as f:
        status = json.load(f)
    return slots, states, sources, status


@pytest.mark.parametrize("policy, name", [
    ({"name": "dual-agent"}, "dual-agent"),
    ({"name": "drf", "placement": "dltap"}, "drf+dltap"),
    ({"name": "chic"}, "chic"),
])
def test_daemon_runs_the_policy_until_every_job_finishes(tmp_path, policy, name):
    if policy["name"] == "chic":
        policy = {**policy, "checkpoint": chic_checkpoint(tmp_path / "chic.npz")}
    slots, states, sources, status = run_daemon(config(tmp_path / "state", policy))
    assert 0 < slots < 400
    assert states == [JobState.COMPLETED] * 6
    assert len(sources) == slots  # one decision per slot
    assert status["policy"] == name
    # The policy decided most slots itself, and its output was always valid (within capacity): the only
    # fallbacks are the starvation guard's (SRTF-like orders and an untrained Chic leave long jobs waiting).
    assert sum(src == "policy" for src, _ in sources) > len(sources) / 2
    assert all("starves job" in why for src, why in sources if src == "fallback")


# ------------------------------------------------------------------------------------------- on Slurm

@pytest.mark.parametrize("placement, table, expected", [
    ("balance", {}, "slurm"),  # Slurm picks the nodes
    ("dltap", {}, "target"),  # DLTAP's placement becomes the --nodelist
    ("dltap", {"placement": "slurm"}, "slurm"),  # unless [slurm] says otherwise
    ("balance", {"placement": "target"}, "target"),
])
def test_policy_placement_sets_the_slurm_backends_node_selection(tmp_path, placement, table, expected):
    from dl2d.daemon.main import make_backend

    cfg = build_config({"state_dir": str(tmp_path), "backend": "slurm", "slurm": table,
                        "policy": {"name": "drf", "placement": placement}}, {})
    assert make_backend(cfg).config.placement == expected


def test_bad_slurm_placement_is_a_config_error(tmp_path):
    """Refused by the config check itself, before the backend (or anything on disk) is made."""
    with pytest.raises(ConfigError, match="slurm: placement must be one of slurm, target"):
        build_config({"state_dir": str(tmp_path), "backend": "slurm", "slurm": {"placement": "dltap"}}, {})
