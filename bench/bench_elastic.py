"""Elastic runtime: hot PS scaling vs checkpoint/restart (DL2 Fig. 13) and the four scaling steps (Fig. 14).

Every job is a real ``dl2-run --local`` process (coordinator) with PS and worker processes talking
over loopback TCP; the benchmark drives it from outside like the daemon does: through the control
API (``dl2d.elastic.control.scale``, i.e. new PS processes register with INC_SERVER and are added
one by one) or with a signal (SIGUSR1: pause at a consistent version, atomic checkpoint, exit 75)
followed by a relaunch of ``dl2-run`` at the new size from the checkpoint.

Measured, per model size (synchronous training, 2 workers, starting from 1 PS):

* hot: adding k = 1..K PSs in one ``scale`` call; per added PS the runtime's record gives the
  suspension seen at each worker (from the pull that reaches the scaling clock to the first pull
  from the new owners) and the four step times; the suspension at a worker for "add k" is the
  sum over the k one-by-one events (as in DL2).  The job is shrunk back to 1 PS hot between values
  of k (removal timings are recorded too).
* checkpoint/restart: SIGUSR1 -> checkpoint -> exit -> relaunch with ``--ps 1+k`` -> resume; the
  suspension is the gap between the last step completed before the signal and the first step
  completed after the restart (both timestamped by the coordinators), with a breakdown.
  The job goes back to 1 PS by a second restart between values of k.

    python bench/bench_elastic.py [--sizes 100k 2.5M] [--max-add 8] [--ckpt-add 1 4 8] [--reps 3] [--json docs/bench/elastic_bench.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dl2d.elastic import control
from dl2d.elastic.model import TrainConfig, parse_size

WORKERS = 2
BASE_PS = 1
#: Each launched job's secret by coordinator address (control calls authenticate with it).
SECRETS: dict[str, str] = {}


def launch(ckdir: str, size: str, ps: int, args) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "dl2d.elastic.launcher", "--local", "--quiet", "--checkpoint-dir", ckdir,
           "--model-size", size, "--workers", str(WORKERS), "--ps", str(ps), "--epochs", str(args.epochs),
           "--samples", str(args.samples), "--global-batch", str(args.global_batch),
           # the output layer sums over the hidden units: scale the step down with the width,
           # or the large MLP diverges (NaN) within a few hundred steps
           "--lr", f"{0.01 * min(1.0, 1e5 / parse_size(size)):.6g}",
           "--progress-interval", "0.2", "--log-dir", os.path.join(ckdir, "logs")]
    log = open(os.path.join(ckdir, "dl2-run.log"), "ab")
    try:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, DL2D_PROGRESS_URL=""))
    finally:
        log.close()


def tail(ckdir: str, n: int = 3000) -> str:
    out = []
    for root, _, files in os.walk(ckdir):
        for f in sorted(files):
            if f.endswith(".log"):
                with open(os.path.join(root, f), errors="replace") as fh:
                    txt = fh.read()[-n:]
                if txt.strip():
                    out.append(f"--- {f}\n{txt}")
    return "\n".join(out)


def wait_running(ckdir: str, min_step: int, timeout: float = 120.0) -> str:
    """Wait until the job trains (progress.json says running at step >= min_step); return the coordinator address."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(os.path.join(ckdir, "progress.json")) as f:
                p = json.load(f)
            if p["state"] == "running" and p["step"] >= min_step:
                addr = control.read_coordinator_file(ckdir)
                SECRETS[addr] = control.read_job_secret(ckdir)
                return addr
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.02)
    raise TimeoutError(f"job in {ckdir} not running")


def wait_records(addr: str, n: int, key: str, timeout: float = 30.0) -> list[dict]:
    """STATUS records once at least ``n`` exist and the last one has ``key`` (filled by the next step)."""
    deadline = time.monotonic() + timeout
    while True:
        recs = control.status(addr, secret=SECRETS[addr])["records"]
        if len(recs) >= n and recs[-1].get(key) is not None:
            return recs
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {key} in records: {recs[-1:] if recs else recs}")
        time.sleep(0.02)


def stop_job(p: subprocess.Popen, ckdir: str, sig=signal.SIGTERM, timeout: float = 120.0) -> int:
    if p.poll() is None:
        p.send_signal(sig)
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        raise RuntimeError(f"dl2-run did not exit after {sig}:\n{tail(ckdir)}")
    if p.returncode != 75:
        raise RuntimeError(f"dl2-run exit {p.returncode}:\n{tail(ckdir)}")
    return p.returncode


def hot_run(size: str, args, tmp: str, tick) -> dict:
    ckdir = tempfile.mkdtemp(prefix="hot-", dir=tmp)
    p = launch(ckdir, size, BASE_PS, args)
    out = {"add": {}, "remove": {}, "events": []}
    try:
        addr = wait_running(ckdir, 5)
        n = 0
        for k in range(1, args.max_add + 1):
            t0 = time.perf_counter()
            res = control.scale(addr, workers=WORKERS, ps=BASE_PS + k, method="hot", timeout=300,
                                secret=SECRETS[addr])
            wall = time.perf_counter() - t0
            n += len(res["records"])
            recs = wait_records(addr, n, "step_gap_s")[-len(res["records"]):]
            out["add"][k] = {"records": recs, "scale_call_s": wall}
            out["events"] += recs
            tick()
            res = control.scale(addr, workers=WORKERS, ps=BASE_PS, method="hot", timeout=300,
                                secret=SECRETS[addr])
            n += len(res["records"])
            recs = wait_records(addr, n, "step_gap_s")[-len(res["records"]):]
            out["remove"][k] = {"records": recs}
            out["events"] += recs
        st = control.status(addr, secret=SECRETS[addr])
        out["iter_time_s"] = st["iter_time"]
    finally:
        if p.poll() is None:
            stop_job(p, ckdir)
    return out


def restart(p: subprocess.Popen, ckdir: str, size: str, ps: int, args) -> tuple[subprocess.Popen, dict]:
    """Signal the running job, wait for its checkpoint exit, relaunch at ``ps`` PSs; the restart record."""
    t_sig = time.time()
    stop_job(p, ckdir, signal.SIGUSR1)
    t_exit = time.time()
    p = launch(ckdir, size, ps, args)
    addr = wait_running(ckdir, 0)
    rec = [r for r in wait_records(addr, 1, "step_gap_s") if r["kind"] == "restart"][-1]
    rec = dict(rec, t_signal=t_sig, t_exited=t_exit)
    # breakdown of the gap (all wall-clock seconds on this host)
    last = rec["t_last_step_before"]
    rec["b_signal_to_saved"] = rec["t_checkpoint_saved"] - max(last, t_sig)
    rec["b_saved_to_exit"] = t_exit - rec["t_checkpoint_saved"]
    rec["b_exit_to_coordinator"] = rec["t_coordinator_init"] - t_exit
    rec["b_roles_register"] = rec["t_roles_registered"] - rec["t_coordinator_init"]
    rec["b_restore"] = rec["t_restored"] - rec["t_roles_registered"]
    rec["b_first_step"] = rec["t_first_step_after"] - rec["t_restored"]
    rec["b_before_signal"] = max(0.0, t_sig - last)
    return p, rec


def ckpt_run(size: str, args, tmp: str, tick) -> dict:
    ckdir = tempfile.mkdtemp(prefix="ckpt-", dir=tmp)
    p = launch(ckdir, size, BASE_PS, args)
    out = {"add": {}, "remove": {}}
    try:
        wait_running(ckdir, 5)
        for k in args.ckpt_add:
            time.sleep(0.3)  # train a little at the current size
            p, rec = restart(p, ckdir, size, BASE_PS + k, args)
            out["add"][k] = rec
            tick()
            time.sleep(0.3)
            p, rec = restart(p, ckdir, size, BASE_PS, args)
            out["remove"][k] = rec
    finally:
        if p.poll() is None:
            stop_job(p, ckdir)
    return out


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def spread(xs):
    xs = [x for x in xs if x is not None]
    return (min(xs), max(xs)) if xs else (None, None)


def ms(x):
    return "-" if x is None else f"{1e3 * x:.1f}"


def summarize(raw: dict, args) -> dict:
    summ = {}
    for size, r in raw.items():
        s = {"n_params": r["n_params"], "hot_add": {}, "hot_remove": {}, "ckpt_add": {}, "ckpt_remove": {},
             "steps_add_1to2": {}, "steps_all_adds": {}, "iter_time_s": med([h.get("iter_time_s") for h in r["hot"]])}
        for k in range(1, args.max_add + 1):
            for kind, dst in (("add", "hot_add"), ("remove", "hot_remove")):
                susp = [sum(e["t_step4_worker_update"] or 0.0 for e in h[kind][k]["records"]) for h in r["hot"]]
                gap = [sum(e["step_gap_s"] for e in h[kind][k]["records"]) for h in r["hot"]]
                lo, hi = spread(susp)
                s[dst][k] = {"suspension_med_s": med(susp), "suspension_min_s": lo, "suspension_max_s": hi,
                             "step_gap_med_s": med(gap), "n": len(susp)}
        for k in args.ckpt_add:
            for kind, dst in (("add", "ckpt_add"), ("remove", "ckpt_remove")):
                recs = [c[kind][k] for c in r["ckpt"]]
                gap = [x["step_gap_s"] for x in recs]
                lo, hi = spread(gap)
                d = {"step_gap_med_s": med(gap), "step_gap_min_s": lo, "step_gap_max_s": hi, "n": len(gap)}
                for b in ("b_signal_to_saved", "b_saved_to_exit", "b_exit_to_coordinator", "b_roles_register",
                          "b_restore", "b_first_step"):
                    d[b] = med([x[b] for x in recs])
                s[dst][k] = d
        steps = ("t_step1_registration", "t_step2_assignment", "t_wait_clock", "t_step3_migration",
                 "t_step4_worker_update")
        adds = [e for h in r["hot"] for e in h["events"] if e["kind"] == "add_ps"]
        first = [e for e in adds if e["ps_before"] == 1]
        for name, evs in (("steps_add_1to2", first), ("steps_all_adds", adds)):
            for st in steps:
                lo, hi = spread([e[st] for e in evs])
                s[name][st] = {"med_s": med([e[st] for e in evs]), "min_s": lo, "max_s": hi}
            s[name]["moved_params_med"] = med([e["moved_params"] for e in evs])
            s[name]["n"] = len(evs)
        summ[size] = s
    return summ


def print_tables(summ: dict, args, con: Console) -> None:
    for size, s in summ.items():
        t = Table(title=f"Training suspension at a worker when adding k PS to a {s['n_params']:,}-parameter job "
                        f"(1 PS, {WORKERS} workers; median \\[min-max] ms over {args.reps} reps)")
        for c in ("k", "hot: worker suspension", "hot: step gap", "ckpt/restart: step gap", "ratio"):
            t.add_column(c, justify="right")
        for k in range(1, args.max_add + 1):
            h = s["hot_add"][k]
            c = s["ckpt_add"].get(k)
            t.add_row(str(k), f"{ms(h['suspension_med_s'])} [{ms(h['suspension_min_s'])}-{ms(h['suspension_max_s'])}]",
                      ms(h["step_gap_med_s"]),
                      f"{ms(c['step_gap_med_s'])} [{ms(c['step_gap_min_s'])}-{ms(c['step_gap_max_s'])}]" if c else "",
                      f"{c['step_gap_med_s'] / h['suspension_med_s']:.0f}x" if c and h["suspension_med_s"] else "")
        con.print(t)
        t = Table(title=f"Scaling steps when adding one PS, {s['n_params']:,} parameters (median \\[min-max] ms)")
        t.add_column("event")
        for c in ("n", "moved params", "1 registration", "2 assignment+clock", "(wait for clock)",
                  "3 migration", "4 worker suspension"):
            t.add_column(c, justify="right")
        for name, label in (("steps_add_1to2", "1 -> 2 PS"), ("steps_all_adds", "all adds")):
            d = s[name]
            t.add_row(label, str(d["n"]), f"{d['moved_params_med']:,.0f}",
                      *[f"{ms(d[st]['med_s'])} [{ms(d[st]['min_s'])}-{ms(d[st]['max_s'])}]"
                        for st in ("t_step1_registration", "t_step2_assignment", "t_wait_clock",
                                   "t_step3_migration", "t_step4_worker_update")])
        con.print(t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["100k", "2.5M"], help="approximate parameter counts")
    ap.add_argument("--max-add", type=int, default=8, help="hot: add k = 1..max-add PSs")
    ap.add_argument("--ckpt-add", type=int, nargs="+", default=[1, 4, 8],
                    help="checkpoint/restart: values of k measured")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=100000, help="large: the job must not finish")
    ap.add_argument("--samples", type=int, default=2048)
    ap.add_argument("--global-batch", type=int, default=64)
    ap.add_argument("--json", dest="json_out", default="docs/bench/elastic_bench.json")
    args = ap.parse_args()
    args.ckpt_add = [k for k in args.ckpt_add if k <= args.max_add]
    con = Console(stderr=True)
    raw: dict = {}
    t_start = time.time()
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="dl2-elastic-bench-") as tmp, Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=con) as prog:
        total = len(args.sizes) * args.reps * (args.max_add + len(args.ckpt_add))
        task = prog.add_task("elastic scaling", total=total)
        for size in args.sizes:
            cfg = TrainConfig.for_model_size(parse_size(size), n_samples=args.samples,
                                             global_batch=args.global_batch)
            raw[size] = {"n_params": cfg.n_params, "n_blocks": len(cfg.blocks()), "hot": [], "ckpt": []}
            for rep in range(args.reps):
                prog.update(task, description=f"{size} hot rep {rep + 1}")
                raw[size]["hot"].append(hot_run(size, args, tmp, lambda: prog.advance(task)))
                prog.update(task, description=f"{size} ckpt/restart rep {rep + 1}")
                raw[size]["ckpt"].append(ckpt_run(size, args, tmp, lambda: prog.advance(task)))
    summ = summarize(raw, args)
    print_tables(summ, args, Console())
    out = {"benchmark": "elastic hot scaling vs checkpoint/restart (DL2 Fig. 13/14)",
           "command": "python bench/bench_elastic.py " + " ".join(sys.argv[1:]),
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                       "loadavg_start": load0},
           "config": {"workers": WORKERS, "base_ps": BASE_PS, "sizes": args.sizes, "reps": args.reps,
                      "max_add": args.max_add, "ckpt_add": args.ckpt_add, "global_batch": args.global_batch,
                      "samples": args.samples, "sync": True},
           "wall_s": time.time() - t_start, "summary": summ, "raw": raw}
    out["machine"]["loadavg_end"] = os.getloadavg()
    if args.json_out:
        os.makedirs(os.path.dirname(os.path.abspath(args.json_out)), exist_ok=True)
        with open(args.json_out, "w") as f:
            json.dump(out, f, indent=1, default=str)
        con.print(f"wrote {args.json_out}")


if __name__ == "__main__":
    main()
