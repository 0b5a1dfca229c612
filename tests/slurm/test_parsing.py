"""Parsers on output recorded from the local Slurm 22.05 (tests/slurm/fixtures) and on the
newer shapes described in Slurm's docs."""

from __future__ import annotations

from pathlib import Path

import pytest

from dl2d.slurm.driver import SlurmUnavailable
from dl2d.slurm.parsing import (
    expand_hostlist,
    gpu_count,
    is_unavailable_message,
    job_from_scontrol,
    number,
    parse_job,
    parse_scontrol_record,
    parse_sinfo_json,
    parse_squeue_json,
    parse_time_limit,
    state_list,
)

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_squeue_22_05_fixture():
    jobs = {j.job_id: j for j in parse_squeue_json(fixture("squeue-22.05.json"))}
    running = jobs["3"]
    assert (running.state, running.name, running.num_nodes) == ("RUNNING", "dl2d-job-1", 3)
    assert running.nodes == ("node1", "node2", "node3") and running.node_list == "node[1-3]"
    assert running.gpus_per_node == 2
    assert running.dl2d_job_id == "job-1" and running.active
    assert running.time_limit_min == 10 and running.batch_host == "node1" and running.user == "root"
    pending = jobs["4"]
    assert pending.state == "PENDING" and pending.nodes == () and pending.num_nodes == 4
    assert pending.gpus_per_node == 4 and pending.reason == "Resources"
    assert jobs["5"].state == "COMPLETED" and not jobs["5"].active
    assert jobs["1"].state == "CANCELLED" and jobs["1"].restarts == 1
    assert jobs["1"].dl2d_job_id == "job-7"


def test_sinfo_22_05_fixture():
    nodes = {n.name: n for n in parse_sinfo_json(fixture("sinfo-22.05.json"))}
    assert sorted(nodes) == ["node1", "node2", "node3", "node4"]
    n1 = nodes["node1"]
    assert (n1.state, n1.cpus, n1.gpus, n1.gpus_alloc, n1.cpus_alloc) == ("mixed", 16, 4, 2, 2)
    assert n1.usable and n1.gpus_free == 2 and n1.partitions == ("gpu",)
    n4 = nodes["node4"]
    assert n4.drained and not n4.usable and n4.gpus_free == 0
    assert n4.reason == "dl2d test drain" and "DRAIN" in n4.flags


@pytest.mark.parametrize("name", ["squeue-22.05-controller-down.json",
                                  "sinfo-22.05-controller-down.json"])
def test_controller_down_json_is_unavailable(name):
    parse = parse_squeue_json if name.startswith("squeue") else parse_sinfo_json
    with pytest.raises(SlurmUnavailable, match="reported errors"):
        parse(fixture(name))


def test_scontrol_show_job_fixture():
    lines = fixture("scontrol-show-job-22.05.txt").splitlines()
    rec = parse_scontrol_record(lines[0])
    assert rec["JobId"] == "3" and rec["Comment"] == "dl2d:job-1" and rec["NodeList"] == "node[1-3]"
    job = job_from_scontrol(rec)
    assert (job.state, job.num_nodes, job.gpus_per_node, job.time_limit_min) == ("RUNNING", 3, 2, 10)
    assert job.user == "root"  # UserId=root(0)
    pending = job_from_scontrol(parse_scontrol_record(lines[1]))
    assert pending.num_nodes == 4 and pending.nodes == () and pending.dl2d_job_id == "job-2"


def test_scontrol_values_with_spaces():
    rec = parse_scontrol_record("NodeName=n1 OS=Linux 6.1 #1 SMP Reason=bad gpu [root@2024] Port=1")
    assert rec == {"NodeName": "n1", "OS": "Linux 6.1 #1 SMP", "Reason": "bad gpu [root@2024]",
                   "Port": "1"}


def test_newer_squeue_shapes():
    """Slurm 23.02+: numbers as {set, infinite, number}, states as lists, gres/gpu."""
    job = parse_job({
        "job_id": 525, "name": "x", "job_state": ["RUNNING", "COMPLETING"],
        "nodes": "gpu[001-002]", "node_count": {"set": True, "infinite": False, "number": 2},
        "tres_per_node": "gres/gpu:l40s:2", "comment": {"job": "dl2d:j5", "administrator": ""},
        "time_limit": {"set": True, "infinite": False, "number": 60},
        "start_time": {"set": True, "infinite": False, "number": 1755290346},
        "restart_cnt": 0, "batch_host": "gpu001",
    })
    assert (job.state, job.num_nodes, job.nodes) == ("RUNNING", 2, ("gpu001", "gpu002"))
    assert (job.gpus_per_node, job.dl2d_job_id, job.time_limit_min) == (2, "j5", 60)
    assert job.start_time == 1755290346
    unlimited = parse_job({"job_id": 1, "job_state": "PENDING", "nodes": "",
                           "time_limit": {"set": False, "infinite": True, "number": 0},
                           "tres_per_job": "gres/gpu:4", "node_count": 2})
    assert unlimited.time_limit_min is None and unlimited.gpus_per_node == 2


def test_newer_sinfo_shape():
    doc = {"errors": [], "warnings": [], "sinfo": [
        {"node": {"state": ["IDLE", "DRAIN"]}, "nodes": {"nodes": ["a1"]},
         "cpus": {"allocated": 0, "total": 64, "maximum": 64},
         "gres": {"total": "tmpsize:7T,gpu:l40s:4(S:0-1)", "used": "gpu:l40s:0(IDX:N/A)"},
         "reason": "maintenance", "partition": {"name": "p1"}},
        {"node": {"state": ["MIXED"]}, "nodes": {"nodes": ["a2"]},
         "cpus": {"allocated": 8, "total": 64, "maximum": 64},
         "gres": {"total": "gpu:4", "used": "gpu:1(IDX:0)"}, "reason": "",
         "partition": {"name": "p1"}},
        {"node": {"state": ["MIXED"]}, "nodes": {"nodes": ["a2"]},
         "cpus": {"allocated": 8, "total": 64, "maximum": 64},
         "gres": {"total": "gpu:4", "used": "gpu:1(IDX:0)"}, "reason": "",
         "partition": {"name": "p2"}},
    ]}
    nodes = {n.name: n for n in parse_sinfo_json(doc)}
    assert nodes["a1"].drained and nodes["a1"].gpus == 4 and nodes["a1"].reason == "maintenance"
    a2 = nodes["a2"]
    assert (a2.state, a2.cpus_alloc, a2.gpus_alloc, a2.gpus_free) == ("mixed", 8, 1, 3)
    assert a2.partitions == ("p1", "p2")


@pytest.mark.parametrize("hostlist,expected", [
    ("", ()),
    ("node1", ("node1",)),
    ("node[1-3]", ("node1", "node2", "node3")),
    ("node[1-2,7],gpu[08-10]", ("node1", "node2", "node7", "gpu08", "gpu09", "gpu10")),
    ("rack[1-2]-n[1-2]", ("rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2")),
    ("a,b", ("a", "b")),
])
def test_expand_hostlist(hostlist, expected):
    assert expand_hostlist(hostlist) == expected


@pytest.mark.parametrize("gres,count", [
    ("gpu:4", 4), ("gres:gpu:2", 2), ("gres/gpu:a100:2", 2), ("gpu:2(IDX:0-1)", 2),
    ("tmpsize:7T,gpu:l40s:4(S:0-1)", 4), ("gpu", 1), ("", 0), ("(null)", 0), ("N/A", 0),
    ("gpu:a100:1,gpu:v100:2", 3), ("mps:100", 0),
])
def test_gpu_count(gres, count):
    assert gpu_count(gres) == count


def test_small_helpers():
    assert number(5) == 5 and number({"set": True, "number": 7}) == 7
    assert number({"set": False, "number": 7}) is None and number(4294967294) is None
    assert number(True) is None and number("x") is None
    assert state_list("IDLE+DRAIN") == ["IDLE", "DRAIN"] and state_list(["mixed"]) == ["MIXED"]
    assert [parse_time_limit(s) for s in ("10", "10:30", "01:00:00", "1-00:00:00", "UNLIMITED")] \
        == [10, 11, 60, 1440, None]
    assert is_unavailable_message("slurm_load_jobs error: Unable to contact slurm controller "
                                  "(connect failure)")
    assert not is_unavailable_message("sbatch: error: Invalid generic resource (gres) specification")
    # transient: retried with backoff, not a refusal (seen on the local Slurm right after a shrink)
    assert is_unavailable_message("scontrol: error: Job update not available right now, the DB index is being "
                                  "set, try again in a bit for job 1")
