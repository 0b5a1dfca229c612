"""What `dl2ctl sim` and `dl2ctl train` share: number checks, which options were given, the packaged workloads'
names, a site's speed model and the table's sparkline."""
from __future__ import annotations

import math

import click

SPARK = "▁▂▃▄▅▆▇█"


def finite_number(ctx, param, value):
    """click callback: a float option is a finite number (FloatRange lets nan through, and inf where unbounded)."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number")
    return value


def given_options(ctx: click.Context, names) -> list[str]:
    """The parameters among ``names`` given on the command line (not defaults)."""
    return [n for n in names if ctx.get_parameter_source(n) is click.core.ParameterSource.COMMANDLINE]


def flags(names) -> str:
    """Parameter names as their flags: ``--sl-iters, --lr``."""
    return ", ".join("--" + n.replace("_", "-") for n in names)


def site_speed_model(value: str, trace) -> tuple:
    """``--speed-model``: (a site's calibrated curves or None, the PS speed table's name). A FILE is read with
    dl2d.workload.speedfit (a bad one is a clear error); its classes that are no model of the trace are named
    on stderr, as they change nothing."""
    if value in ("measured", "parametric"):
        return None, value
    from dl2d.workload.speedfit import SiteSpeeds, SpeedModelError, load_speed_model

    try:
        site = SiteSpeeds.of(load_speed_model(value), source=str(value))
    except SpeedModelError as e:
        raise click.BadParameter(f"{e} (give measured, parametric or a file from dl2ctl calibrate)",
                                 param_hint="--speed-model") from None
    models = {n for n, ar in zip(trace.speed_names(), trace.allreduce) if ar}
    unused = [n for n in site.names() if n not in models]
    if unused:
        click.echo(f"--speed-model: {', '.join(unused)}: no all-reduce model of this trace; those curves are not "
                   "used", err=True)
    return site, "measured"


def parse_workload(text: str) -> tuple[str, int | None]:
    """`philly` (generated) or `pollux:K` / `pollux-realistic:K` (the packaged workload K, 1-8)."""
    name, _, k = text.strip().lower().partition(":")
    if name == "philly" and not k:
        return "philly", None
    folders = {"pollux": "workloads", "pollux-realistic": "workloads-realistic"}
    if name in folders and k.isdigit() and 1 <= int(k) <= 8:
        return folders[name], int(k)
    raise click.BadParameter(f"{text!r}: give philly, pollux:K or pollux-realistic:K with K in 1-8",
                             param_hint="--workload")


def sparkline(values, width: int = 24) -> str:
    """Mean of `values` over `width` equal chunks, drawn with block characters (0 = ▁, 1 = █)."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return ""
    chunks = np.array_split(v, min(width, v.size))
    return "".join(SPARK[min(int(np.mean(c) * len(SPARK)), len(SPARK) - 1)] for c in chunks)
