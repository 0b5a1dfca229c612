"""Per-job measurements in the daemon: the simulated backend runs two jobs, one at half the speed model's
speed (a hidden interference factor of 0.5); two real `dl2-agent --fake-gpus` processes report GPU
processes of the jobs' Slurm ids (the sim backend's `sim-<id>`), one GPU shared with a foreign job. Each
slot's job_slot_stats rows carry the measured speed factor and GPU features; the policy's view gets them,
the decision record flags the slow and the shared job, a restarted daemon keeps the flags, and
`dl2ctl report` shows them."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from sqlalchemy import select
from testkit.agents import TOKEN, start_agent, stop_agents

from dl2d.daemon.config import build_config
from dl2d.daemon.main import build_loop
from dl2d.daemon.sim_backend import Hidden
from dl2d.db.engine import session_scope
from dl2d.db.jobs import submit_job
from dl2d.db.models import Decision, JobSlotStat, Slot
from dl2d.policy.registry import StatelessPolicy

SPEC = {"owner": "bob", "job_type": "resnet-50", "total_epochs": 9000, "command": "python t.py",
        "worker": {"gpus": 1, "cpus": 2, "mem_gb": 8}, "ps": {"cpus": 2, "mem_gb": 4}}


class Feeder:
    """Submits the two jobs at slot 0; `hidden` gives the simulated cluster their true speed factors."""

    hidden = {"slow": Hidden(9000.0, 0.5), "fast": Hidden(9000.0, 1.0)}

    def __call__(self, session, number, now):
        if number == 0:
            for name in ("slow", "fast"):  # ids 1, 2 -> Slurm ids sim-1, sim-2
                submit_job(session, {**SPEC, "name": name}, now=now)
        return 0


def test_job_stats_recorded_flagged_in_view_and_reported(tmp_path):
    tok = tmp_path / "agent.token"
    tok.write_text(TOKEN + "\n")
    tok.chmod(0o600)
    procs = []
    try:
        procs.append(start_agent(str(tok), "sim001", "--fake-job", "0=sim-1@70", "--fake-job", "1=sim-1@70"))
        procs.append(start_agent(str(tok), "sim002", "--fake-job", "0=sim-2@50", "--fake-job", "0=4242"))
        cfg = build_config({"state_dir": str(tmp_path), "sim": {"cluster": "tiny"}, "metrics": {"enabled": False},
                            "agents": {"nodes": {"sim001": procs[0][1], "sim002": procs[1][1]},
                                       "token_file": str(tok), "timeout": 2.0}}, {})
        loop = build_loop(cfg, feeder=Feeder())
        views = []
        policy = loop.policy
        loop.policy = StatelessPolicy(lambda v: (views.append(v), policy(v))[1], "spy")
        loop.run(max_slots=4)

        with session_scope(loop.engine) as s:
            stats = s.execute(select(Slot.number, JobSlotStat).join(Slot, Slot.id == JobSlotStat.slot_id)
                              .order_by(Slot.number, JobSlotStat.job_id)).all()
            flags = [d.job_flags for d in s.scalars(select(Decision).join(Slot).order_by(Slot.number))]
        assert [(n, r.job_id) for n, r in stats] == [(n, j) for n in range(4) for j in (1, 2)]
        for _, r in stats:
            assert r.workers > 0 and r.epochs > 0 and not r.ended
            assert r.epochs_per_s == pytest.approx(r.epochs / cfg.slot_seconds)
            want = 0.5 if r.job_id == 1 else 1.0  # x the simulator's per-slot noise, +-10 %
            assert want * 0.89 <= r.speed_factor <= want * 1.11
            assert r.speed_factor == pytest.approx(r.epochs_per_s / r.predicted_epochs_per_s)
            gpus, util, shared = (2, 70.0, False) if r.job_id == 1 else (1, 50.0, True)
            assert (r.gpus, r.gpu_util_mean_pct, r.shared_gpu) == (gpus, util, shared)
            assert r.gpu_mem_per_gpu_max_bytes == 4 * 1024**3 and r.gpu_observations == gpus
        # slot 0 decides before anything was measured; the shared GPU is seen after one slot, the slow job
        # after three slots below the threshold
        assert flags == [None, {"2": ["shared_gpu"]}, {"2": ["shared_gpu"]},
                         {"1": ["slow"], "2": ["shared_gpu"]}]
        assert views[0].job_speed_factor.size == 2 and np.isnan(views[0].job_speed_factor).all()
        last = views[-1]
        assert last.job_ids.tolist() == [1, 2] and last.job_shared_gpu.tolist() == [False, True]
        assert last.job_speed_factor == pytest.approx([0.5, 1.0], rel=0.11)

        # a restarted daemon reloads each job's recent stats: the flags are there at its first decision
        loop2 = build_loop(cfg)
        loop2.run(max_slots=1)
        with session_scope(loop2.engine) as s:
            d = s.scalars(select(Decision).join(Slot).where(Slot.number == 4)).one()
            assert d.job_flags == {"1": ["slow"], "2": ["shared_gpu"]}

        cp = subprocess.run([sys.executable, "-m", "dl2d.cli.main", "report", "--db", cfg.database_url, "--json",
                             "--only", "job_speed"], capture_output=True, text=True, timeout=60)
        assert cp.returncode == 0, cp.stderr
        rows = {r["name"]: r for r in json.loads(cp.stdout)["job_speed"]}
        assert set(rows) == {"slow", "fast"} and rows["slow"]["n_slots"] == 5
        assert 0.45 <= rows["slow"]["avg_speed_factor"] <= 0.55 and 0.9 <= rows["fast"]["avg_speed_factor"] <= 1.1
        assert rows["slow"]["avg_epochs_per_h"] < rows["slow"]["avg_predicted_epochs_per_h"]
        assert (rows["slow"]["avg_gpu_util"], rows["fast"]["avg_gpu_util"]) == (70.0, 50.0)
        assert (rows["slow"]["n_shared_slots"], rows["fast"]["n_shared_slots"]) == (0, 5)
        assert rows["slow"]["max_gpu_mem_gib"] == 4.0
        table = subprocess.run([sys.executable, "-m", "dl2d.cli.main", "report", "--db", cfg.database_url],
                               capture_output=True, text=True, timeout=60)
        assert table.returncode == 0 and "job_speed" in table.stdout and "slow" in table.stdout
    finally:
        stop_agents(procs)
