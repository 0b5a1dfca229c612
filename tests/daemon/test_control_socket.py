"""The daemon's control socket: dl2ctl's writes go to the daemon, which learns the caller
from the kernel (SO_PEERCRED) and decides the rights from its own config. Run with a real daemon process, real
unix users (`nobody` beside root) and the real dl2ctl; a user's own config, a raw client that skips dl2ctl, and
the database named directly all fail to cancel root's job or to submit for root."""
from __future__ import annotations

import json
import os
import shutil
import select as io_select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from dl2d.core.users import is_admin
from dl2d.daemon.control import (
    MAX_REQUEST_BYTES,
    Caller,
    ControlError,
    ControlServer,
    ask,
    caller_of,
    handle,
    read_request,
    socket_path_problem,
)
from dl2d.db.engine import make_engine, session_scope, upgrade
from dl2d.db.models import Event, Job, JobState
from testkit.as_user import dl2ctl

REPO = Path(__file__).resolve().parents[2]
SPEC = {"name": "r1", "job_type": "resnet-50", "total_epochs": 5000, "command": "python t.py",
        "worker": {"gpus": 1, "cpus": 2, "mem_gb": 8}, "ps": {"cpus": 2, "mem_gb": 4}}
SUBMIT_FLAGS = ["-J", "mine", "--type", "resnet-50", "--epochs", "5000", "--wrap", "python t.py",
                "--gpus-per-worker", "1", "--cpus-per-worker", "2", "--mem-per-worker", "8G",
                "--cpus-per-ps", "2", "--mem-per-ps", "4G"]


def _caller(user: str, admin: bool = False, uid: int = 1000) -> Caller:
    return Caller(uid=0 if user == "root" else uid, gid=uid, pid=1, user=user, admin=admin or user == "root")


@pytest.fixture
def engine(tmp_path):
    url = f"sqlite:///{tmp_path / 'dl2d.sqlite'}"
    upgrade(url)
    e = make_engine(url)
    yield e
    e.dispose()


def _jobs(engine) -> list[tuple[int, str, str]]:
    with session_scope(engine) as s:
        return [(j.id, j.owner, j.state.value) for j in s.scalars(select(Job).order_by(Job.id))]


# ---------------------------------------------------------------------------------------------- the decision

def test_the_daemon_decides_owner_and_admin_rights(engine):
    alice, bob, carol = _caller("alice"), _caller("bob", uid=1001), _caller("carol", admin=True, uid=1002)
    r = handle({"op": "submit", "submission": SPEC}, alice, engine)
    assert r["ok"] and r["job"]["owner"] == "alice", r  # no owner given: the caller
    jid = r["job"]["id"]
    r = handle({"op": "submit", "submission": {**SPEC, "owner": "root"}}, alice, engine)
    assert not r["ok"] and r["errors"] == [
        "owner 'root': only root or a dl2d admin may submit for another user (you are 'alice')"], r
    assert handle({"op": "submit", "submission": {**SPEC, "owner": "bob"}}, carol, engine)["ok"]
    r = handle({"op": "cancel", "job_ids": [jid]}, bob, engine)
    assert r["results"] == [{"id": jid, "cancelled": False, "error": f"user 'bob' may not cancel job {jid}: it "
                             "belongs to 'alice' (only the owner or root can cancel it)"}], r
    r = handle({"op": "cancel", "job_ids": [jid, 999]}, carol, engine)
    assert r["results"][0] == {"id": jid, "cancelled": True, "name": "r1"}
    assert r["results"][1] == {"id": 999, "cancelled": False, "error": "no job with id 999"}
    r = handle({"op": "cancel", "job_ids": [jid]}, alice, engine)
    assert r["results"][0]["error"] == (f"job {jid} is already CANCELLED; only pending or running jobs can be "
                                        "cancelled")
    assert _jobs(engine) == [(jid, "alice", "CANCELLED"), (jid + 1, "bob", "PENDING")]
    assert handle({"op": "whoami"}, carol, engine) == {"ok": True, "user": "carol", "uid": 1002, "admin": True}


def test_uid_0_is_an_admin_whatever_its_name_and_group(engine, monkeypatch):
    """Root's rights come from its uid, not its name: uid 0 under another login name (the BSDs' ``toor``, or
    a passwd entry renamed) and with the admin group missing may still cancel any job and submit for anyone;
    the same name on another uid may not."""
    import dl2d.daemon.control as control

    monkeypatch.setattr(control, "user_name", lambda uid: "toor")
    root, other = caller_of(0, 0, 1, "no-such-group"), caller_of(4242, 4242, 2, "no-such-group")
    assert root.admin and root.user == "toor" and not other.admin
    jid = handle({"op": "submit", "submission": {**SPEC, "owner": "alice"}}, root, engine)["job"]["id"]
    assert handle({"op": "whoami"}, root, engine) == {"ok": True, "user": "toor", "uid": 0, "admin": True}
    assert not handle({"op": "cancel", "job_ids": [jid]}, other, engine)["results"][0]["cancelled"]
    assert handle({"op": "cancel", "job_ids": [jid]}, root, engine)["results"][0]["cancelled"]


@pytest.mark.parametrize("request_, error", [
    ([1, 2], "a request is a JSON object, got list"),
    ({"op": "drop_tables"}, "unknown op 'drop_tables': one of whoami, status, submit, cancel"),
    ({}, "unknown op None: one of whoami, status, submit, cancel"),
    ({"op": "cancel"}, "job_ids must be a non-empty list of job ids"),
    ({"op": "cancel", "job_ids": [1, "2"]}, "job_ids: not a job id: '2' (ids are integers from 1 to 2^63-1)"),
    ({"op": "cancel", "job_ids": [True]}, "job_ids: not a job id: True (ids are integers from 1 to 2^63-1)"),
    ({"op": "cancel", "job_ids": [2 ** 70]}, f"job_ids: not a job id: {2 ** 70} (ids are integers from 1 to "
                                              "2^63-1)"),
    ({"op": "cancel", "job_ids": list(range(1, 10_002))}, "job_ids: at most 10000 ids in one request, got 10001"),
    ({"op": "submit", "submission": "x"}, "submission must be a JSON object, got str"),
])
def test_malformed_requests_get_one_clear_error_and_write_nothing(engine, request_, error):
    assert handle(request_, _caller("root"), engine) == {"ok": False, "error": error}
    assert _jobs(engine) == []


def test_an_invalid_submission_lists_every_problem_and_writes_nothing(engine):
    r = handle({"op": "submit", "submission": {**SPEC, "owner": "bob", "total_epochs": -1, "name": "a\n"}},
               _caller("alice"), engine)
    assert not r["ok"] and len(r["errors"]) == 3, r
    assert r["errors"][0].startswith("owner 'bob'") and any("total_epochs" in m for m in r["errors"])
    assert _jobs(engine) == []


def test_read_request_bounds():
    import io

    assert read_request(io.BytesIO(b'{"op": "whoami"}\n')) == {"op": "whoami"}
    for raw, msg in ((b"x" * 30 + b"\n", "request is not JSON"), (b'{"op": 1}', "not ended by a newline"),
                     (b"\xff\xfe\n", "request is not JSON"), (b"1" * 65, "larger than 64 bytes")):
        with pytest.raises(ValueError, match=msg):
            read_request(io.BytesIO(raw), limit=64)


def test_socket_paths_that_cannot_be_are_refused():
    assert socket_path_problem("/run/dl2d/dl2d.sock") is None
    assert socket_path_problem("/" + "x" * 120) == "is 121 bytes long; a Unix socket's path may have at most 107"
    assert socket_path_problem("") == "is empty"


# ---------------------------------------------------------------------------------------------- the socket

@pytest.fixture
def shared_dir():
    """A directory other users may enter (pytest's tmp_path is root's alone), removed afterwards."""
    d = tempfile.mkdtemp(prefix="dl2d-ctl-")
    os.chmod(d, 0o755)
    yield Path(d)
    shutil.rmtree(d, ignore_errors=True)


def test_the_server_survives_garbage_floods_and_stalls_and_a_stale_socket_is_replaced(shared_dir, engine,
                                                                                      monkeypatch):
    import dl2d.daemon.control as control

    monkeypatch.setattr(control, "READ_TIMEOUT_S", 2.0)  # shortened for the test
    path = str(shared_dir / "c.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:  # a daemon that died left its socket
        stale.bind(path)
    srv = ControlServer(path, engine, "dl2d-admin")
    srv.start()
    try:
        assert os.stat(path).st_mode & 0o777 == 0o666
        assert ask(path, {"op": "whoami"}) == {"ok": True, "user": "root", "uid": 0, "admin": True}
        with pytest.raises(ControlError, match="another process answers on it"):
            ControlServer(path, engine, "dl2d-admin").start()

        def raw(payload: bytes, close_write: bool = True) -> dict:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                c.settimeout(30)
                c.connect(path)
                c.sendall(payload)
                if close_write:
                    c.shutdown(socket.SHUT_WR)
                return json.loads(c.makefile("rb").readline())

        assert raw(b"\x00\xff garbage\n") == {"ok": False, "error": raw(b"\x00\xff garbage\n")["error"]}
        assert raw(b"\x00\xff garbage\n")["error"].startswith("request is not JSON")
        assert raw(b"{" * 5000 + b"\n")["ok"] is False  # nesting too deep for json: a clean error
        big = raw(b"[" + b"1," * (MAX_REQUEST_BYTES // 2 + 8) + b"1]\n")
        assert big == {"ok": False, "error": f"request larger than {MAX_REQUEST_BYTES} bytes"}
        # the requests above are answered; their threads may still be letting their slots go (on a loaded machine)
        end = time.monotonic() + 10
        while srv._server.limiter.in_use and time.monotonic() < end:
            time.sleep(0.01)
        assert srv._server.limiter.in_use == 0
        # 40 clients (this test's uid) that connect and send nothing: the server keeps answering meanwhile
        idle = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(40)]
        for c in idle:
            c.connect(path)
        t0 = time.monotonic()
        # one uid holds at most MAX_PER_UID connections: those over it are answered "busy" at once by the
        # accepting thread; the ones held are answered when the whole-request deadline (2 s) runs out
        answered_now: set = set()
        while time.monotonic() - t0 < 1.5 and len(answered_now) < 40 - control.MAX_PER_UID:
            ready, _, _ = io_select.select([c for c in idle if c not in answered_now], [], [], 0.1)
            answered_now.update(ready)
            assert srv._server.limiter.in_use <= control.MAX_PER_UID
        time.sleep(1.1)  # past the grace of the oldest idle ones: a real request takes the place of one
        assert ask(path, {"op": "whoami"})["uid"] == 0
        replies = {c: json.loads(c.makefile("rb").readline()) for c in idle}
        busy = {"ok": False, "busy": True, "error": "dl2d is busy: too many control connections at once; try again"}
        stalled = {"ok": False, "error": "no request within the read timeout"}
        assert all(replies[c] == busy for c in answered_now), replies
        # which connections got a slot is the order the accepting thread saw them in; each one admitted over the
        # share took the place of an older one (which hears the timeout at once)
        n_busy = sum(r == busy for r in replies.values())
        assert sum(r == stalled for r in replies.values()) == 40 - n_busy >= control.MAX_PER_UID, replies
        assert 40 - n_busy - srv._server.limiter.replaced <= control.MAX_PER_UID
        assert time.monotonic() - t0 < 10
        for c in idle:
            c.close()
        assert ask(path, {"op": "whoami"})["ok"]
    finally:
        srv.close()
    assert not os.path.exists(path)


# ---------------------------------------------------------------------------------------------- a real daemon

def _as_nobody_available() -> None:
    try:
        import pwd

        pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("needs the user nobody")
    if os.geteuid() != 0:
        pytest.skip("needs root, to act as another user")


def _dl2ctl(*args: str, user: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return dl2ctl(*args, user=user, env=env)


@pytest.fixture
def daemon(shared_dir):
    """A real dl2d (simulated cluster) whose state dir others may enter; its database and config stay root's."""
    state = shared_dir / "state"
    state.mkdir(mode=0o755)
    sock = shared_dir / "dl2d.sock"
    config = shared_dir / "dl2d.toml"
    config.write_text(f'state_dir = "{state}"\nslot_seconds = 0.3\nadmin_group = "dl2d-admin"\n'
                      f'[control]\nsocket = "{sock}"\n[sim]\ncluster = "tiny"\npace = true\n[metrics]\n'
                      'enabled = false\n')
    config.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DL2D_")}
    p = subprocess.Popen([sys.executable, "-m", "dl2d.daemon.main", "--config", str(config)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**env,
                                                                                            "PYTHONUNBUFFERED": "1"})
    end = time.time() + 60
    while not sock.exists() and p.poll() is None and time.time() < end:
        time.sleep(0.05)
    assert sock.exists(), p.communicate(timeout=10)[0] if p.poll() is not None else "no socket within 60 s"
    yield {"config": config, "socket": sock, "db": f"sqlite:///{state / 'dl2d.sqlite'}", "state": state}
    p.terminate()
    out = p.communicate(timeout=60)[0]
    assert p.returncode == 0, out
    assert not sock.exists(), "the socket is removed at a clean stop"


def test_a_user_cannot_cancel_roots_job_or_submit_for_root_whatever_config_they_use(daemon, shared_dir):
    _as_nobody_available()
    root_env = {"DL2D_CONFIG": str(daemon["config"])}
    r = _dl2ctl("submit", *SUBMIT_FLAGS, "--json", env=root_env)
    assert r.returncode == 0, r.stderr
    root_job = json.loads(r.stdout)
    assert root_job["owner"] == "root"

    # nobody's own config: it claims nobody's group is the admin group, names the daemon's socket and database
    own = shared_dir / "nobody.toml"
    own.write_text(f'admin_group = "nogroup"\ndb_url = "{daemon["db"]}"\n[control]\nsocket = "{daemon["socket"]}"\n')
    own.chmod(0o644)
    assert is_admin("nobody", "nogroup")  # the client's own check would let it through
    env = {"DL2D_CONFIG": str(own)}
    r = _dl2ctl("cancel", str(root_job["id"]), user="nobody", env=env)
    assert r.returncode == 1 and (f"cannot cancel job {root_job['id']}: user 'nobody' may not cancel job "
                                  f"{root_job['id']}: it belongs to 'root'") in r.stderr, (r.stdout, r.stderr)
    r = _dl2ctl("submit", *SUBMIT_FLAGS, "--owner", "root", user="nobody", env=env)
    # dl2ctl asked the daemon who nobody is (whoami: not an admin) and refuses at once; the daemon would too
    assert r.returncode == 1 and "owner 'root': only root or a dl2d admin may submit for another user (you are 'nobody')" in r.stderr, \
        (r.stdout, r.stderr)
    # ... nor with the database named directly: only the daemon's account and group may even read it (0640)
    r = _dl2ctl("cancel", str(root_job["id"]), "--db", daemon["db"], user="nobody", env=env)
    assert r.returncode == 1 and "unable to open database file" in (r.stdout + r.stderr), (r.stdout, r.stderr)
    r = _dl2ctl("submit", *SUBMIT_FLAGS, "--owner", "root", "--db", daemon["db"], user="nobody", env=env)
    assert r.returncode == 1, (r.stdout, r.stderr)
    # ... nor with a client of its own that speaks the socket's protocol and skips dl2ctl altogether
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python:
        probe = ("import json,sys; from dl2d.daemon.control import ask; p=sys.argv[1]; "
                 "print(json.dumps([ask(p, {'op': 'whoami'}), ask(p, {'op': 'cancel', 'job_ids': [int(sys.argv[2])]}),"
                 " ask(p, {'op': 'submit', 'submission': {**json.loads(sys.argv[3]), 'owner': 'root'}})]))")
        cp = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", python, "-c", probe,
                             str(daemon["socket"]), str(root_job["id"]), json.dumps(SPEC)],
                            capture_output=True, text=True, cwd="/", timeout=60, env={"PYTHONPATH": str(REPO)})
        assert cp.returncode == 0, cp.stderr
        who, cancel, submit = json.loads(cp.stdout)
        assert who == {"ok": True, "user": "nobody", "uid": 65534, "admin": False}
        assert cancel["results"][0]["cancelled"] is False and not submit["ok"], (cancel, submit)

    # root's job is untouched, and nobody made no job for root
    eng = make_engine(daemon["db"])
    try:
        with session_scope(eng) as s:
            job = s.get(Job, root_job["id"])
            assert job.state in (JobState.PENDING, JobState.RUNNING) and job.owner == "root"
            assert s.scalar(select(func.count()).select_from(Job)) == 1
            assert s.scalar(select(func.count()).select_from(Event).where(Event.job_id == job.id,
                                                                          Event.kind == "cancel")) == 0
    finally:
        eng.dispose()

    # what nobody may do, it does: its own job, then cancelling it
    r = _dl2ctl("submit", *SUBMIT_FLAGS, "--json", user="nobody", env=env)
    assert r.returncode == 0, r.stderr
    mine = json.loads(r.stdout)
    assert mine["owner"] == "nobody"
    r = _dl2ctl("cancel", str(mine["id"]), user="nobody", env=env)
    assert r.returncode == 0 and r.stdout.strip() == f"Cancelled job {mine['id']} (mine)", (r.stdout, r.stderr)
    # root (an admin by the daemon's config, whatever root's environment says) cancels any job
    r = _dl2ctl("cancel", str(root_job["id"]), env=root_env)
    assert r.returncode == 0, r.stderr


def test_with_the_daemon_stopped_a_user_gets_a_clear_error_and_nothing_is_written(shared_dir):
    _as_nobody_available()
    state = shared_dir / "state"
    state.mkdir(mode=0o755)
    url = f"sqlite:///{state / 'dl2d.sqlite'}"
    upgrade(url)  # the daemon's database, left by a daemon that stopped
    own = shared_dir / "nobody.toml"
    own.write_text(f'state_dir = "{state}"\n')
    own.chmod(0o644)
    r = _dl2ctl("submit", *SUBMIT_FLAGS, user="nobody", env={"DL2D_CONFIG": str(own)})
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert f"no dl2d answers on {state / 'dl2d.sock'}" in r.stderr and "unable to open database file" in r.stderr, \
        r.stderr
    eng = make_engine(url)
    try:
        assert _jobs(eng) == []
    finally:
        eng.dispose()


def test_concurrent_submissions_through_the_socket_each_get_their_own_job(daemon):
    """40 at once against a share of 8 connections a user: some are answered "busy" and dl2ctl's client tries
    again. How often depends on the machine's load, so each thread goes on asking until it is served (as a user
    whose dl2ctl said busy would), for at most two minutes: what is asserted is that every submission gets one
    job of its own, none lost and none doubled, however the burst was let in."""
    results: list[dict] = []

    def one(i: int) -> None:
        end = time.monotonic() + 120
        while True:
            reply = ask(str(daemon["socket"]), {"op": "submit", "submission": {**SPEC, "name": f"c{i}"}})
            if not reply.get("busy") or time.monotonic() > end:
                break
        results.append(reply)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r["ok"] for r in results), results
    assert sorted(r["job"]["name"] for r in results) == sorted(f"c{i}" for i in range(40))
    assert len({r["job"]["id"] for r in results}) == 40


def test_any_user_lists_the_nodes_and_pending_reasons_from_the_running_daemon(daemon):
    """`dl2ctl nodes` (like sinfo) asks the daemon, so a user who may read neither its config, its state dir nor
    its database sees the nodes; after the daemon stops, its status file answers (for whoever may read it)."""
    _as_nobody_available()
    env = {"DL2D_SOCKET": str(daemon["socket"])}
    end = time.time() + 60
    while True:
        r = _dl2ctl("nodes", "--json", user="nobody", env=env)
        assert r.returncode == 0, r.stderr
        nodes = json.loads(r.stdout)
        if nodes or time.time() > end:
            break
        time.sleep(0.2)
    assert [n["name"] for n in nodes] == ["sim001", "sim002", "sim003", "sim004"], nodes
    assert all(n["state"] == "idle" and n["gpus_alloc"] == 0 and n["gpus"] > 0 and n["agent"] == "-" for n in nodes)
    big = {**SPEC, "name": "big", "kind": "allreduce", "job_type": "bert", "batch_size": 96, "workers": 2,
           "max_workers": 2, "worker": {"gpus": 1, "cpus": 2, "mem_gb": 8}}
    big.pop("ps")
    assert ask(str(daemon["socket"]), {"op": "submit", "submission": big})["ok"]
    end = time.time() + 60
    while time.time() < end:
        nodes = json.loads(_dl2ctl("nodes", "--json", env=env).stdout)
        if sum(n["gpus_alloc"] for n in nodes) == 2:
            break
        time.sleep(0.2)
    busy = [n for n in nodes if n["gpus_alloc"]]
    assert sum(n["gpus_alloc"] for n in busy) == 2 and all(n["state"] in ("mixed", "allocated") for n in busy), nodes
    assert all(n["state"] == "idle" for n in nodes if not n["gpus_alloc"]), nodes
    r = _dl2ctl("nodes", "-t", "mixed,allocated", "--noheader", user="nobody", env=env)
    assert r.returncode == 0 and sorted(ln.split()[0] for ln in r.stdout.splitlines()) == \
        sorted(n["name"] for n in busy), (r.stdout, r.stderr)
    assert _dl2ctl("nodes", "-t", "drained", env=env).stdout == ""
    r = _dl2ctl("nodes", "-t", "down", env=env)
    assert r.returncode == 2 and "unknown node state(s) 'down'; known: idle, mixed, allocated, drained" in r.stderr


def test_nodes_from_the_status_file_when_the_daemon_is_gone(shared_dir):
    state = shared_dir / "state"
    state.mkdir()
    (state / "dl2d.status.json").write_text(json.dumps({"updated_at": time.time() - 30, "nodes": [
        {"name": "gpu01", "state": "drained", "reason": "dl2d: agent silent for 3 polls (timed out)", "gpus": 4,
         "gpus_alloc": 0, "cpus": 32, "cpus_alloc": 0.0, "mem_gb": 256.0, "mem_gb_alloc": 0.0, "agent": "stale"},
        {"name": "gpu02", "state": "mixed", "reason": "", "gpus": 4, "gpus_alloc": 3, "cpus": 32, "cpus_alloc": 12.0,
         "mem_gb": 256.0, "mem_gb_alloc": 96.5, "agent": "ok"},
        {"name": "gpu03", "state": "mixed", "reason": "", "gpus": 4, "gpus_alloc": 1, "gpus_other": 2, "cpus": 32,
         "cpus_alloc": 4.0, "mem_gb": 256.0, "mem_gb_alloc": 32.0, "agent": "ok"}]}))
    r = _dl2ctl("nodes", "--state-dir", str(state), env={"DL2D_SOCKET": str(shared_dir / "none.sock")})
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith(f"dl2d does not answer on {shared_dir / 'none.sock'}: nodes as its status file had "
                               "them 3")
    assert r.stdout.splitlines() == [
        "NODE   STATE    GPUS   CPUS    MEM_GB  AGENT  REASON",
        "gpu01  drained   0/4   0/32     0/256  stale  dl2d: agent silent for 3 polls (timed out)",
        "gpu02  mixed     3/4  12/32  96.5/256  ok",
        "gpu03  mixed     3/4   4/32    32/256  ok     2 GPUs held by other Slurm jobs",
    ], r.stdout
    r = _dl2ctl("nodes", "--state-dir", str(shared_dir), env={"DL2D_SOCKET": str(shared_dir / "none.sock")})
    assert r.returncode == 1 and "and there is no status file at" in r.stderr


def test_node_report_states_and_agents():
    import numpy as np

    from dl2d.daemon import plan as P
    from dl2d.daemon.backend import NodeInfo

    rows = [P.job_row(1, "resnet-50", 10.0, 0.0, 0, 0, 0, {"worker": {"gpus": 1, "cpus": 2, "mem_gb": 8},
                                                           "ps": {"cpus": 2, "mem_gb": 4}}, "j")]
    infos = [NodeInfo("a", 2, 8, 32.0), NodeInfo("b", 2, 8, 32.0), NodeInfo("c", 2, 8, 32.0),
             NodeInfo("d", 2, 8, 32.0, usable=False, reason="maintenance"), NodeInfo("e", 2, 8, 32.0, gpus_other=1),
             NodeInfo("f", 2, 8, 32.0, gpus_other=2)]
    view = P.build_view(1, rows, infos)
    # a GPU another user's Slurm job holds is not the cluster's to give
    assert view.capacity[:, 0].tolist() == [2, 2, 2, 2, 1, 0] and view.free[:, 0].tolist() == [2, 2, 2, 0, 1, 0]
    usage = np.array([[0, 0, 0], [1, 2, 8], [2, 4, 16], [0, 0, 0], [1, 2, 8], [0, 0, 0]], float)
    report = P.node_report(view, infos, usage, {"a": "ok", "b": "missed 1", "c": "stale"})
    assert [(n["name"], n["state"], n["agent"]) for n in report] == [
        ("a", "idle", "ok"), ("b", "mixed", "missed 1"), ("c", "allocated", "stale"), ("d", "drained", "-"),
        ("e", "allocated", "-"), ("f", "allocated", "-")]
    assert report[3]["reason"] == "maintenance" and report[1]["gpus_alloc"] == 1
    assert [(n["gpus_alloc"], n["gpus_other"]) for n in report[4:]] == [(1, 1), (0, 2)]
