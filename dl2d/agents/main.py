"""``dl2-agent``: serve this node's GPU and host stats to the dl2d daemon."""

from __future__ import annotations

import json
import signal
import socket
import sys

import click

from dl2d.agents.host import HostReader
from dl2d.agents.nvml import FakeNVML, FakeProcess, GPUReader, load_pynvml
from dl2d.agents.sample import Sampler
from dl2d.agents.server import TokenFileError, load_token, make_server

DEFAULT_PORT = 9464
DEFAULT_TOKEN_FILE = "/etc/dl2d/agent.token"
#: Loopback unless told otherwise: the agent speaks plain HTTP, so which network hears it is the admin's choice
#: (the packaged unit reads it from DL2_AGENT_BIND in /etc/default/dl2-agent), never every network by default.
DEFAULT_BIND = "127.0.0.1"


def bind_problem(bind: str) -> str | None:
    """Why ``bind`` is no address to listen on (None: it is). An empty one would mean every address (what an
    unset variable in the unit's ExecStart gives), so it is refused rather than taken as 0.0.0.0."""
    if not bind.strip():
        return ("is empty (it would listen on every address): give this node's cluster-network address, "
                "e.g. DL2_AGENT_BIND=10.1.0.17 in /etc/default/dl2-agent")
    return None


def bind_note(bind: str) -> str | None:
    """A line for the admin about where the agent listens, or None for a specific non-loopback address."""
    if bind in ("0.0.0.0", "::"):
        return (f"listening on every address ({bind}) over plain HTTP: prefer the node's cluster-network "
                "address (--bind, DL2_AGENT_BIND)")
    if bind.startswith("127.") or bind in ("::1", "localhost"):
        return (f"listening on loopback ({bind}) only: the daemon on another host cannot poll this agent; "
                "set --bind (DL2_AGENT_BIND in /etc/default/dl2-agent) to this node's cluster-network address")
    return None


def fake_reader(gpus: int, jobs: tuple[str, ...] = ()) -> GPUReader:
    """FakeNVML with ``gpus`` H100s; each ``GPU=SLURMJOB[@UTIL]`` of ``jobs`` puts a 4 GiB process of that
    Slurm job on that GPU, whose utilisation becomes UTIL % (default 90) (tests of per-job GPU features)."""
    nvml = FakeNVML.h100s(gpus)
    owner: dict[int, str] = {}
    for k, spec in enumerate(jobs):
        where, _, rest = spec.partition("=")
        job, _, util = rest.partition("@")
        if not where.isdigit() or int(where) >= gpus or not job:
            raise click.BadParameter(f"{spec!r}: want GPU=SLURMJOB[@UTIL] with GPU < {gpus}", param_hint="--fake-job")
        g, pid = nvml.gpus[int(where)], 10_000 + k
        g.processes.append(FakeProcess(pid, 4 * 1024**3))
        g.mem_used += 4 * 1024**3
        g.util_gpu = int(util) if util else (g.util_gpu or 90)
        owner[pid] = job
    return GPUReader(nvml, job_of_pid=owner.get)


def build_sampler(node: str, fake_gpus: int | None = None, fake_jobs: tuple[str, ...] = ()) -> Sampler:
    if fake_gpus is not None:
        reader = fake_reader(fake_gpus, fake_jobs)
    else:
        nvml, reason = load_pynvml()
        reader = GPUReader(nvml, reason)
    return Sampler(node, reader, HostReader())


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--port", default=DEFAULT_PORT, show_default=True, help="TCP port (0 = any free port).")
@click.option("--bind", default=DEFAULT_BIND, show_default=True,
              help="Address to listen on: plain HTTP, so give the node's cluster-network address "
                   "(the unit: DL2_AGENT_BIND in /etc/default/dl2-agent).")
@click.option("--token-file", default=DEFAULT_TOKEN_FILE, show_default=True,
              help="Shared bearer token; must be chmod 600.")
@click.option("--node-name", default=None, help="Node name reported (default: short hostname).")
@click.option("--once", is_flag=True, help="Print one JSON sample to stdout and exit (no token needed).")
@click.option("--fake-gpus", type=int, default=None, hidden=True,
              help="Use FakeNVML with N fake H100s (tests and benchmarks).")
@click.option("--fake-job", "fake_jobs", multiple=True, hidden=True, metavar="GPU=SLURMJOB[@UTIL]",
              help="With --fake-gpus: a process of Slurm job SLURMJOB on fake GPU GPU (repeatable).")
def main(port: int, bind: str, token_file: str, node_name: str | None, once: bool,
         fake_gpus: int | None, fake_jobs: tuple[str, ...]) -> None:
    """Serve GPU (NVML) and host stats as JSON over HTTP for the dl2d poller."""
    node = node_name or socket.gethostname().split(".")[0]
    if fake_jobs and fake_gpus is None:
        raise click.BadParameter("needs --fake-gpus", param_hint="--fake-job")
    sampler = build_sampler(node, fake_gpus, fake_jobs)
    if once:
        click.echo(json.dumps(sampler.sample(), indent=2))
        return
    problem = bind_problem(bind)
    if problem:
        click.echo(f"dl2-agent: --bind {problem}", err=True)
        sys.exit(2)
    try:
        token = load_token(token_file)
    except TokenFileError as e:
        click.echo(f"dl2-agent: {e}", err=True)
        sys.exit(2)
    try:
        srv = make_server(bind, port, token, sampler.sample_json)
    except OSError as e:
        click.echo(f"dl2-agent: cannot listen on {bind}:{port}: {e.strerror or e}", err=True)
        sys.exit(2)
    host, real_port = srv.server_address[:2]
    click.echo(f"dl2-agent: node {node} listening on http://{host}:{real_port}", err=False)
    sys.stdout.flush()
    note = bind_note(bind)
    if note:
        click.echo(f"dl2-agent: {note}", err=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # clean exit under systemd
    try:
        srv.serve_forever(poll_interval=0.5)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        srv.server_close()


if __name__ == "__main__":
    main()
