"""`dl2ctl`: the user and admin command line of dl2d.

Each sub-command lives in its own module under `dl2d.cli`; they are imported lazily so that
`dl2ctl --help` stays fast (JAX is only imported by the commands that need it).
"""
from __future__ import annotations

import importlib
import importlib.util

import click

# name -> "module:attribute" of a click command; one line per command.
COMMANDS: dict[str, str] = {
    "sim": "dl2d.cli.sim:sim",
    "report": "dl2d.cli.report:report",
    "train": "dl2d.cli.train:train",
    "submit": "dl2d.cli.jobs:submit",
    "queue": "dl2d.cli.jobs:queue",
    "show": "dl2d.cli.jobs:show",
    "cancel": "dl2d.cli.jobs:cancel",
    "daemon": "dl2d.cli.daemon:daemon",
    "nodes": "dl2d.cli.nodes:nodes",
    "calibrate": "dl2d.cli.calibrate:calibrate",
    "conform": "dl2d.cli.conform:conform",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(n for n, t in COMMANDS.items() if importlib.util.find_spec(t.split(":")[0]))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None or name not in self.list_commands(ctx):
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dl2d")
def cli() -> None:
    """dl2d command line: simulate, train, submit and inspect DL training jobs.

    Run `dl2ctl COMMAND --help` for the options of each command.
    """


if __name__ == "__main__":  # pragma: no cover
    cli()
