"""What the Slurm backend asks of Slurm and reports back, over the in-memory Slurm (dl2d.slurm.memory):
the CPUs and memory per node a job's tasks need, the default time limit, the exact finish time, shrinks
that stay in place, and the start-up check of the rights to drain nodes. The same on the real local Slurm:
test_daemon_on_slurm_requests.py."""

from __future__ import annotations

import json
import logging
import os
import pwd

from dl2d.daemon.backend import FINISHED, SHRINK, START, JobRequest, Target
from dl2d.daemon.slurm.backend import SlurmBackend, backend_from_section
from dl2d.daemon.slurm.settings import SlurmBackendConfig, SlurmSection
from dl2d.slurm.backoff import BackoffPolicy
from dl2d.slurm.cli_driver import sbatch_args
from dl2d.slurm.driver import JobSpec
from dl2d.slurm.memory import InMemorySlurm
from dl2d.slurm.pyslurm_driver import submit_description_kwargs
from dl2d.slurm.rights import (
    check_drain_rights,
    drain_rights_problem,
    parse_show_config,
    slurm_user,
)

#: The issue's job: --cpus-per-worker 2 --mem-per-worker 1G --cpus-per-ps 1 --mem-per-ps 512M, 1 GPU a worker.
SPEC = {"command": "true", "worker": {"gpus": 1, "cpus": 2, "mem_gb": 1.0}, "ps": {"cpus": 1, "mem_gb": 0.5},
        "time_limit_min": None, "owner": pwd.getpwuid(os.geteuid()).pw_name}  # run as the tests' own user


def backend(tmp_path, fake, **cfg) -> SlurmBackend:
    config = SlurmBackendConfig(state_dir=tmp_path / "state", checkpoint_timeout_s=1.0, poll_interval_s=0.01,
                                backoff=BackoffPolicy(base=0.001, cap=0.001, max_attempts=2), **cfg)
    return SlurmBackend(fake, config)


def job(job_id=1, **spec) -> JobRequest:
    return JobRequest(job_id, "resnet-50", 5, {**SPEC, **spec})


def test_a_job_asks_for_the_cpus_and_memory_of_its_busiest_node_and_the_default_time_limit(tmp_path):
    fake = InMemorySlurm()
    b = backend(tmp_path, fake, time_limit_min=10)
    assert b.apply(job(), Target(2, 1)).method == START
    spec = fake.specs["101"]
    # one node: 2 workers (2 cores, 1 GB each) + 1 PS (1 core, 512 MB)
    assert (spec.nodes, spec.gpus_per_node, spec.cpus_per_node, spec.mem_mb_per_node) == (1, 2, 5, 2560)
    assert spec.time_limit_min == 10  # the spec's explicit null is "none given"
    assert b._record(1)["allocation"] == {"nodes": 1, "gpus_per_node": 2, "cpus_per_node": 5,
                                          "mem_mb_per_node": 2560}
    b.apply(job(2, time_limit_min=45, worker={"gpus": 4, "cpus": 2, "mem_gb": 1.0}), Target(3, 2))
    spec = fake.specs["102"]
    assert (spec.nodes, spec.gpus_per_node, spec.cpus_per_node, spec.mem_mb_per_node) == (3, 4, 3, 1536)
    assert spec.time_limit_min == 45
    assert fake.slurm_jobs["102"].cpus_per_node == 3 and fake.slurm_jobs["102"].time_limit_min == 45


def test_the_drivers_pass_cpus_and_memory_per_node():
    spec = JobSpec(name="x", command="true", nodes=2, gpus_per_node=4, cpus_per_node=3, mem_mb_per_node=1536)
    args = sbatch_args(spec)
    assert "--mincpus=3" in args and "--mem=1536M" in args and "--gres=gpu:4" in args
    kw = submit_description_kwargs(spec)
    assert kw["min_cpus_per_node"] == 3 and kw["memory_per_node"] == 1536
    bare = sbatch_args(JobSpec(name="x", command="true"))
    assert not any(a.startswith(("--mincpus", "--mem")) for a in bare)  # never --mem=0 (the whole node)


def test_a_shrink_that_fits_stays_in_the_same_slurm_job(tmp_path):
    fake = InMemorySlurm()
    b = backend(tmp_path, fake)
    big = job(worker={"gpus": 4, "cpus": 2, "mem_gb": 1.0})
    b.apply(big, Target(4, 1))  # 4 nodes x 4 GPUs
    fake.run()
    assert (fake.slurm_jobs["101"].num_nodes, fake.slurm_jobs["101"].cpus_per_node) == (4, 3)
    r = b.apply(big, Target(2, 1))
    assert (r.method, r.backend_ref) == (SHRINK, "101") and fake.calls[-1] == ("shrink", "101", 2)
    assert b._record(1)["allocation"] == {"nodes": 2, "gpus_per_node": 4, "cpus_per_node": 3,
                                          "mem_mb_per_node": 1536}
    # one worker and its PS fit on one of the two nodes it keeps: shrunk again, same Slurm job
    assert b.apply(big, Target(1, 1)).backend_ref == "101" and fake.calls[-1] == ("shrink", "101", 1)


def test_the_finish_time_is_slurms_end_time_and_stays_recorded(tmp_path):
    now = [1_000_000.0]
    fake = InMemorySlurm(clock=lambda: now[0])
    b = backend(tmp_path, fake)
    b.apply(job(), Target(1, 1))
    fake.run()
    now[0] += 30
    progress = b.job_dir(1) / "job" / "progress.json"
    progress.write_text(json.dumps({"epoch": 5, "status": "done"}))
    fake.end("101")  # EndTime = 1_000_030
    now[0] += 1200  # observed a slot later
    st = b.observe()[1]
    assert st.state == FINISHED and st.finished_at.timestamp() == 1_000_030
    assert b._record(1)["finished_at"] == 1_000_030
    del fake.slurm_jobs["101"]  # Slurm forgets it after MinJobAge: the record still knows
    assert b.observe()[1].finished_at.timestamp() == 1_000_030


def test_rights_to_drain_from_slurms_configuration():
    config = parse_show_config("Configuration data as of 2024-01-01T00:00:00\nAccountingStorageType   = "
                               "accounting_storage/none\nSlurmUser               = slurm(64030)\n")
    assert slurm_user(config) == ("slurm", 64030)
    assert drain_rights_problem(0, "root", config, None) is None
    assert drain_rights_problem(64030, "slurm", config, None) is None
    line = drain_rights_problem(999, "dl2d", config, None)
    assert "user dl2d (uid 999)" in line and "not root, not SlurmUser slurm" in line
    assert "AccountingStorageType=accounting_storage/none" in line and "run dl2d as slurm" in line
    dbd = {**config, "AccountingStorageType": "accounting_storage/slurmdbd"}
    assert drain_rights_problem(999, "dl2d", dbd, "Administrator") is None
    assert "its AdminLevel is Operator (node updates need Administrator)" in \
        drain_rights_problem(999, "dl2d", dbd, "Operator")
    assert "sacctmgr add user dl2d" in drain_rights_problem(999, "dl2d", dbd, None)

    fake = InMemorySlurm()
    fake.config = dbd
    fake.admin_levels["dl2d"] = "Operator"
    assert "AdminLevel is Operator" in check_drain_rights(fake, 999, "dl2d")
    fake.admin_levels["dl2d"] = "Administrator"
    assert check_drain_rights(fake, 999, "dl2d") is None


def test_the_backend_checks_its_rights_at_start_with_one_line(tmp_path, monkeypatch, caplog):
    fake = InMemorySlurm()
    fake.config = {"SlurmUser": "slurm(64030)", "AccountingStorageType": "accounting_storage/none"}
    monkeypatch.setattr("dl2d.slurm.rights.current_user", lambda: (999, "dl2d"))
    monkeypatch.setattr("dl2d.slurm.driver.make_driver", lambda kind, **options: fake)
    with caplog.at_level(logging.WARNING, logger="dl2d.daemon.slurm.backend"):
        b = backend_from_section(SlurmSection(state_dir=str(tmp_path / "s"), run_jobs_as="daemon"), tmp_path)
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [f"Slurm rights: {b.rights_problem}"] and "user dl2d (uid 999)" in errors[0]
    caplog.clear()
    fake.down = True  # Slurm cannot be asked: a warning, and the daemon goes on
    with caplog.at_level(logging.WARNING, logger="dl2d.daemon.slurm.backend"):
        assert backend(tmp_path, fake).check_rights() is None
    assert "Slurm rights not checked (Slurm could not be asked" in caplog.text
