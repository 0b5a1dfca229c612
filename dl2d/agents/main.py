"""``dl2-agent``: serve this node's GPU and host stats to the dl2d daemon."""

from __future__ import annotations

import json
import signal
import socket
import sys

import click

from dl2d.agents.host import HostReader
from dl2d.agents.nvml import FakeNVML, GPUReader, load_pynvml
from dl2d.agents.sample import Sampler
from dl2d.agents.server import TokenFileError, load_token, make_server

DEFAULT_PORT = 9464
DEFAULT_TOKEN_FILE = "/etc/dl2d/agent.token"


def build_sampler(node: str, fake_gpus: int | None = None) -> Sampler:
    if fake_gpus is not None:
        reader = GPUReader(FakeNVML.h100s(fake_gpus))
    else:
        nvml, reason = load_pynvml()
        reader = GPUReader(nvml, reason)
    return Sampler(node, reader, HostReader())


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--port", default=DEFAULT_PORT, show_default=True, help="TCP port (0 = any free port).")
@click.option("--bind", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--token-file", default=DEFAULT_TOKEN_FILE, show_default=True,
              help="Shared bearer token; must be chmod 600.")
@click.option("--node-name", default=None, help="Node name reported (default: short hostname).")
@click.option("--once", is_flag=True, help="Print one JSON sample to stdout and exit (no token needed).")
@click.option("--fake-gpus", type=int, default=None, hidden=True,
              help="Use FakeNVML with N fake H100s (tests and benchmarks).")
def main(port: int, bind: str, token_file: str, node_name: str | None, once: bool,
         fake_gpus: int | None) -> None:
    """Serve GPU (NVML) and host stats as JSON over HTTP for the dl2d poller."""
    node = node_name or socket.gethostname().split(".")[0]
    sampler = build_sampler(node, fake_gpus)
    if once:
        click.echo(json.dumps(sampler.sample(), indent=2))
        return
    try:
        token = load_token(token_file)
    except TokenFileError as e:
        click.echo(f"dl2-agent: {e}", err=True)
        sys.exit(2)
    srv = make_server(bind, port, token, sampler.sample_json)
    host, real_port = srv.server_address[:2]
    click.echo(f"dl2-agent: node {node} listening on http://{host}:{real_port}", err=False)
    sys.stdout.flush()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # clean exit under systemd
    try:
        srv.serve_forever(poll_interval=0.5)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        srv.server_close()


if __name__ == "__main__":
    main()
