"""A job submitted with an adaptive batch (docs/jobs.md): dl2d gives it, at every (re)start, the batch of the
highest goodput on its GPUs within its own limits, learns its gradient noise from its reports, stores both, and
`dl2ctl show` says so; a bad limit or a non-finite noise report is refused with a clear error and never applied."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner
from sqlalchemy import select

from dl2d.cli.main import cli
from dl2d.core.contract import Allocation
from dl2d.core.jobs import IntentKind
from dl2d.daemon import batches
from dl2d.daemon import plan as P
from dl2d.daemon.backend import NodeInfo
from dl2d.daemon.config import build_config
from dl2d.daemon.main import build_loop
from dl2d.daemon.slurm.planning import batch_from_progress
from dl2d.daemon.slurm.jobreport import checked_progress
from dl2d.db.engine import session_scope
from dl2d.db.errors import SubmissionError
from dl2d.db.jobs import submit_job, validate_submission
from dl2d.db.models import Decision, Job
from dl2d.workload import batching, efficiency

WORKER = {"gpus": 1, "cpus": 1, "mem_gb": 1}
ADAPTIVE = {"name": "adapt", "owner": "bob", "kind": "allreduce", "job_type": "cifar10", "batch_size": 128.0,
            "total_epochs": 40.0, "command": "python t.py", "worker": WORKER, "adaptive_batch": True,
            "max_batch_size": 2048.0}


# ------------------------------------------------------------------------------------------ submission

@pytest.mark.parametrize("change,message", [
    ({"max_batch_size": 64.0}, "max_batch_size (64) is below the job's batch_size (128)"),
    ({"max_local_batch": 0}, "max_local_batch must be >= 1"),
    ({"max_batch_size": math.nan}, "max_batch_size must be a number"),
    ({"adaptive_batch": "yes"}, "adaptive_batch must be true or false"),
    ({"job_type": "my-llm", "batch_size": None, "epoch_seconds": 60.0}, "dl2d chooses the batch of a model"),
    ({"adaptive_batch": False}, "max_batch_size: a limit of the batch dl2d chooses"),
])
def test_a_bad_batch_limit_is_refused_with_the_reason(change, message):
    spec = {k: v for k, v in {**ADAPTIVE, **change}.items() if v is not None}
    with pytest.raises(SubmissionError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_submission(spec)


def test_dl2ctl_submit_takes_the_adaptive_batch_and_its_limits_as_typed():
    r = CliRunner().invoke(cli, ["submit", "--dry-run", "-J", "a", "--type", "cifar10", "--batch-size", "128",
                                 "--epochs", "3", "--wrap", "python t.py", "--cpus-per-worker", "1", "--mem-per-worker", "1G",
                                 "--adaptive-batch",
                                 "--max-batch-size", "4096", "--max-local-batch", "256"])
    assert r.exit_code == 0, r.output
    assert '"adaptive_batch": true' in r.output and '"max_batch_size": 4096.0' in r.output
    assert '"max_local_batch": 256' in r.output
    r = CliRunner().invoke(cli, ["submit", "--dry-run", "-J", "a", "--type", "cifar10", "--batch-size", "128",
                                 "--epochs", "3", "--wrap", "python t.py", "--cpus-per-worker", "1", "--mem-per-worker", "1G",
                                 "--max-local-batch", "256"])
    assert r.exit_code != 0 and "give adaptive_batch = true (dl2ctl submit --adaptive-batch)" in r.output


# ------------------------------------------------------------------------------------------ the job's report

def test_a_non_finite_noise_report_is_refused_without_failing_the_job():
    ok = batch_from_progress(checked_progress({"step": 5, "batch_size": 256, "grad_sqr": 0.5, "grad_var": 2.0}))
    assert ok == {"batch_size": 256.0, "grad_noise": (0.5, 2.0)}
    for bad, why in [({"grad_sqr": math.nan, "grad_var": 1.0}, "grad_sqr = nan is not a finite number"),
                     ({"grad_sqr": 1.0, "grad_var": -1.0}, "grad_var = -1 is outside"),
                     ({"grad_sqr": 0.0, "grad_var": 1.0}, "grad_sqr = 0 must be > 0"),
                     ({"grad_sqr": 1.0}, "grad_sqr and grad_var come together")]:
        got = batch_from_progress(checked_progress({"step": 5, "batch_size": 256, **bad}))
        assert "grad_noise" not in got and why in got["report_error"], (bad, got)
        assert got["report_error"].startswith("its gradient noise report is refused")


def test_the_noise_fit_moves_from_the_model_toward_the_jobs_reports_and_counts_each_once():
    prior = efficiency.job_prior("cifar10", 128.0, 3)
    init = batching.limits("cifar10").init
    noisy = (prior[0], prior[1] * 8 * init / 128.0)  # 8x the model's noise scale, as the job reports it
    doc, ratios = None, []
    for epochs in (3.1, 3.2, 3.2, 3.3, 3.4, 3.5, 3.6, 3.7, 3.8):  # 3.2 twice: the same report seen again
        new = batches.learned_noise(ADAPTIVE, "cifar10", 128.0, epochs, doc, noisy)
        if new is None:
            assert epochs == 3.2 and doc is not None
            continue
        doc = new
        ratios.append(efficiency.NoiseFit.from_json(doc).ratio())
    assert len(ratios) == 8 and all(b > a for a, b in zip(ratios, ratios[1:]))
    assert 4 < ratios[-1] < 8  # toward the job's 8x, the model's weight fading
    assert batches.learned_noise({**ADAPTIVE, "adaptive_batch": False}, "cifar10", 128.0, 9.0, doc, noisy) is None
    with pytest.raises(ValueError, match="grad_sqr > 0 and grad_var >= 0"):
        efficiency.fit_noise(efficiency.NoiseFit(), (1.0, math.inf), prior)
    assert efficiency.NoiseFit.from_json({"reports": "x"}) == efficiency.NoiseFit()


# ------------------------------------------------------------------------------------------ the plan

NODES = [NodeInfo(f"n{i}", gpus=4, cpus=32, mem_gb=256) for i in range(4)]


def rows(adaptive_batch: float = 0.0, noise=None):
    spec = {k: v for k, v in ADAPTIVE.items() if k not in ("name", "owner", "job_type", "total_epochs")}
    fixed = {**spec, "adaptive_batch": False}
    fixed.pop("max_batch_size")
    return [P.job_row(1, "cifar10", 40.0, 2.0, 4, 0, 3, spec, "adapt"),
            P.job_row(2, "cifar10", 40.0, 2.0, 4, 0, 3, fixed, "fixed")], adaptive_batch, noise


def view_of(adaptive_batch: float = 0.0, noise=None):
    jobs, b, n = rows(adaptive_batch, noise)
    jobs[0] = replace(jobs[0], batch_size=b, noise=n)
    return P.build_view(5, jobs, NODES)


def test_the_view_holds_an_adaptive_jobs_batch_limits_and_fitted_noise():
    v = view_of()
    assert v.adaptive.tolist() == [True, False] and v.batch_size.tolist() == [128.0, 128.0]
    assert v.batch_limits[0, 0] == 2048.0 and np.isnan(v.batch_limits[0, 1]) and np.isnan(v.batch_limits[1]).all()
    assert np.isnan(v.grad_stats).all()  # no report yet: the model's own
    fit = efficiency.NoiseFit(3, math.log(27.0), 1.0, 1.0, 2.0)
    v = view_of(512.0, fit.to_json())
    assert v.batch_size[0] == 512.0
    prior = efficiency.job_prior("cifar10", 512.0, 2.0)
    assert v.grad_stats[0] == pytest.approx([prior[0], prior[1] * fit.ratio()])
    jobs, _, _ = rows()
    fixed_only = P.build_view(5, jobs[1:], NODES)
    assert fixed_only.adaptive is None and fixed_only.grad_stats is None  # a fixed-batch cluster's view as before


def test_a_new_batch_at_the_same_size_is_a_restart_within_the_jobs_limit():
    v = view_of()
    alloc = Allocation(np.array([4, 4]), np.array([0, 0]), batch_size=np.array([8192.0, 0.0]))
    planned, sizes = P.plan_targets(v, alloc, [n.name for n in NODES])
    assert sizes == {1: (4, 0), 2: (4, 0)}
    assert [(t.job_id, t.kind, t.target.batch_size) for t in planned] == [(1, IntentKind.RESIZE, 2048.0)]
    assert P.target_from_json(P.target_to_json(planned[0].target)) == planned[0].target
    same = Allocation(np.array([4, 4]), np.array([0, 0]), batch_size=np.array([128.0, 0.0]))
    assert P.plan_targets(v, same, [n.name for n in NODES])[0] == []  # the batch it has: nothing to do


def test_the_goodput_batch_grows_with_the_gpus_and_keeps_to_the_limits():
    v = view_of()
    grown = batches.with_batches(v, Allocation(np.array([16, 1]), np.array([0, 0])))
    assert grown.batch_size[1] == 0.0 and 128.0 < grown.batch_size[0] <= 2048.0
    one = batches.with_batches(v, Allocation(np.array([1, 1]), np.array([0, 0])))
    assert one.batch_size[0] <= grown.batch_size[0]
    assert batches.with_batches(v, Allocation(np.array([16, 1]), np.array([0, 0])), "fixed").batch_size is None
    chosen = Allocation(np.array([16, 1]), np.array([0, 0]), batch_size=np.array([256.0, 0.0]))
    assert batches.with_batches(v, chosen) is chosen  # a policy that chose batches keeps its own


# ------------------------------------------------------------------------------------------ the daemon

class Feeder:
    hidden = None

    def __init__(self, spec):
        self.spec = spec

    def __call__(self, session, number, now):
        if number == 0:
            submit_job(session, self.spec, known_types=(), now=now)
        return 0


def run_daemon(tmp_path, batch_rule: str, slots: int = 8):
    cfg = build_config({"state_dir": str(tmp_path), "sim": {"cluster": "t4-16", "noise": 0.0},
                        "metrics": {"enabled": False}, "policy": {"name": "elastic", "batch": batch_rule}}, {})
    loop = build_loop(cfg, feeder=Feeder({**ADAPTIVE, "total_epochs": 1e4}))
    loop.run(max_slots=slots)
    with session_scope(loop.engine) as s:
        job = s.scalars(select(Job)).one()
        out = (job.workers, job.batch_size, job.batch_noise, job.epochs_done)
        flags = [d.job_flags for d in s.scalars(select(Decision))]
    loop.engine.dispose()
    return cfg, out, flags


def test_the_daemon_gives_an_adaptive_job_its_goodput_batch_learns_its_noise_and_dl2ctl_show_says_so(tmp_path):
    cfg, (workers, batch, noise, epochs), _ = run_daemon(tmp_path / "goodput", "goodput")
    assert 128.0 < batch <= 2048.0
    fit = efficiency.NoiseFit.from_json(noise)
    assert fit.reports >= 5  # one report a slot it trained in
    _, (fixed_workers, fixed_batch, _, fixed_epochs), _ = run_daemon(tmp_path / "fixed", "fixed")
    assert fixed_batch is None and epochs > 1.2 * fixed_epochs  # the larger batch on its GPUs trains faster
    assert workers > fixed_workers  # sized on its best batch's speeds, it is given the GPUs that batch uses
    r = CliRunner().invoke(cli, ["show", "--db", cfg.database_url, "1"])
    assert r.exit_code == 0, r.output
    assert f"{batch:g} now (submitted 128; at most 2048" in r.output
    assert f"{fit.reports} reports: noise scale" in r.output and "efficiency" in r.output
    assert "x its submitted batch's on its GPUs" in r.output


# ------------------------------------------------------------------------------------------ the Slurm side and the job's

def test_a_running_job_given_a_new_batch_is_restarted_and_a_pending_one_reads_it_when_it_starts():
    from dl2d.daemon.backend import NOOP, RESTART, Target
    from dl2d.daemon.slurm.planning import Current, plan_apply
    from dl2d.daemon.slurm.mapping import SlurmAllocation

    held = SlurmAllocation(1, 4)
    running = Current("RUNNING", held, (4, 0), fixed_size=True)
    assert plan_apply(running, Target(4, 0, batch_size=512.0), held, 1).method == NOOP
    assert plan_apply(replace(running, new_batch=True), Target(4, 0, batch_size=512.0), held, 1).method == RESTART
    pending = Current("PENDING", held, (4, 0), new_batch=True)
    assert plan_apply(pending, Target(4, 0, batch_size=512.0), held, None).method == NOOP


def test_the_job_reads_its_batch_at_each_start_and_reports_its_batch_and_noise(tmp_path):
    import json
    import subprocess

    import dl2d.job
    from dl2d.daemon.slurm.jobdir import target_env
    from dl2d.job.batch import GradientNoise

    env_file = tmp_path / "target.env"
    env_file.write_text(target_env(4, 0, batch_size=1024.0))
    out = subprocess.run(["bash", "-c", f". {env_file}; env"], capture_output=True, text=True, check=True).stdout
    env = dict(line.split("=", 1) for line in out.splitlines() if line.startswith("DL2D_"))
    assert env["DL2D_BATCH_SIZE"] == "1024" and env["DL2D_WORKERS"] == "4"
    env.update(DL2D_INITIAL_BATCH_SIZE="128", DL2D_MAX_LOCAL_BATCH="64", SLURM_NTASKS="4", SLURM_PROCID="0",
               DL2D_COORDINATOR="h:1234", DL2D_PROGRESS_FILE=str(tmp_path / "progress.json"))
    run = dl2d.job.start(10, checkpoint_dir=tmp_path / "ck", env=env, install_handlers=False)
    plan = run.batch_plan(128, 512)
    assert (plan.per_worker, plan.accumulation_steps, plan.total) == (64, 3, 1024)  # 256 a GPU, 64 a pass
    noise = GradientNoise(init_batch=run.contract.initial_batch_size)
    noise.update([2.0, 2.2, 1.8, 2.0], 1.0, 64)
    run.resumed(0)
    run.report_batch(plan.total, noise)
    run.step_done(1)
    report = json.loads((tmp_path / "progress.json").read_text())
    got = batch_from_progress(checked_progress(report))
    assert got["batch_size"] == 1024.0 and got["grad_noise"] == pytest.approx((noise.sqr, noise.var))
