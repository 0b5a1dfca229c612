"""Real Slurm against its twin: the conformance trace (dl2d.daemon.conform) under each policy on a Slurm
cluster and in its twin, side by side (docs/BENCHMARKS.md, "Real Slurm against its twin").

    python bench/bench_conform.py --local                      # starts scripts/slurm-localhost.sh (root)
    python bench/bench_conform.py --local --real-twice         # the noise floor: two real runs compared

On a cluster of your own, ``dl2ctl conform`` runs the same (docs/cli.md).

The cluster must be idle and its GPUs dl2d's to use while it runs (the trace fills it). Writes the reports as
JSON (``--out``) and prints one line per policy.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from dl2d.daemon.conform.compare import compare, ordering, report_line  # noqa: E402
from dl2d.daemon.conform.trace import make_trace  # noqa: E402
from dl2d.daemon.conform.worlds import clean_env, conform, run_real, slurm_shape  # noqa: E402
from dl2d.slurm.cli_driver import CliDriver  # noqa: E402


def real_twice(jobs, policy, slot, conf, root, driver, env) -> dict:
    """Two runs of one policy on Slurm, compared as real against "twin": how far the real world repeats itself."""
    shape = slurm_shape(driver)
    runs = [run_real(jobs, policy, slot, conf, root / policy / f"real-{k}", driver, shape.total_gpus, env=env,
                     prefix=f"cf-{policy}-{k}-") for k in (0, 1)]
    runs[1].world = "twin"
    return {**compare(*runs), "costs": {}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policies", default="dl2-target,elastic,slurm")
    p.add_argument("--slot", type=float, default=3.0, help="slot seconds (both worlds)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=12, help="demo jobs")
    p.add_argument("--jax-jobs", type=int, default=2, help="JAX jobs of docs/jobs.md's recipe (dl2ctl conform's)")
    p.add_argument("--local", action="store_true", help="start a local 4 x 4 GPU Slurm for the run")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "conform.json")
    p.add_argument("--keep", type=Path, help="run both worlds' daemons under this directory and keep it")
    p.add_argument("--real-twice", action="store_true",
                   help="the noise floor instead: run each policy on Slurm twice and compare the two real runs")
    args = p.parse_args()
    local = Path(tempfile.mkdtemp(prefix="dl2d-slurm-")) if args.local else None
    if local is not None:
        subprocess.run(["bash", str(REPO / "scripts" / "slurm-localhost.sh"), "start", str(local)], check=True)
        os.environ["SLURM_CONF"] = str(local / "slurm.conf")
    conf = os.environ.get("SLURM_CONF")
    if not conf:
        p.error("give --local or set SLURM_CONF")
    root = args.keep or Path(tempfile.mkdtemp(prefix="dl2d-conform-"))
    try:
        driver = CliDriver(timeout=15, env={"SLURM_CONF": conf})
        jobs = make_trace(args.jobs, seed=args.seed, slot_seconds=args.slot, jax_jobs=args.jax_jobs)
        env = clean_env({"SLURM_CONF": conf, "PYTHONPATH": str(REPO)})
        reports = []
        for policy in args.policies.split(","):
            t0 = time.monotonic()
            if args.real_twice:
                rep = real_twice(jobs, policy, args.slot, conf, root, driver, env)
            else:
                rep = conform(jobs, policy, args.slot, conf, root, driver, env=env)
            reports.append(rep)
            print(f"{report_line(rep)}; {time.monotonic() - t0:.0f} s", flush=True)
        print("ordering real:", ordering(reports, "real"), " twin:", ordering(reports, "twin"))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"seed": args.seed, "slot_s": args.slot, "jobs": args.jobs,
                                        "jax_jobs": args.jax_jobs, "reports": reports}, indent=1) + "\n")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
        if local is not None:
            subprocess.run(["bash", str(REPO / "scripts" / "slurm-localhost.sh"), "stop", str(local)])
            shutil.rmtree(local, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
