"""New seeded workloads of all-reduce jobs drawn from Microsoft's Philly trace, at a chosen load.

``data/pollux/philly.csv.gz`` holds the GPUs and duration of each of the 82,247 jobs of the Philly trace
(Sept-Dec 2017) as the Pollux artifact ships it (README there). A workload of ``num_jobs`` jobs:

1. draws ``num_jobs`` Philly jobs at random (with replacement): each keeps its GPU count (at most ``max_gpus``);
2. gives them models in the proportions of the Pollux artifact's realistic workloads (:data:`MODEL_MIX`), the
   jobs with the most Philly GPU-time getting the models that need the most (ncf, then cifar10, bert,
   deepspeech2, yolov3, imagenet, by their one-GPU time to converge), so the size order of the trace is kept;
3. sets each job's total batch to its model's per-GPU batch in those workloads times its GPUs
   (:data:`BATCH_PER_GPU`);
4. lets the jobs arrive as a Poisson process of ``load x 20`` jobs an hour per 64 GPUs of the cluster: the
   Pollux workloads bring 160 jobs in 8 hours to 64 GPUs, so ``load = 1`` is their rate on any cluster size and
   ``load = 2`` twice it.

That is the "realistic" style, the jobs as their users submitted them (most ask for one GPU). The "tuned" style
keeps the same jobs (models, arrivals) and gives each one of its model's configurations in the Pollux artifact's
tuned workloads (:data:`TUNED_CONFIGS`: several GPUs and a larger batch each), so a scheduler can be trained and
tuned on workloads of the tuned Pollux workloads' kind without ever seeing those workloads.
"""
from __future__ import annotations

import csv
import functools
import gzip
import io
from importlib import resources

import numpy as np

from dl2d.workload.workloads import WorkloadJob

#: share of the jobs of each model in the Pollux artifact's workloads-realistic (1,280 jobs), by one-GPU time
MODEL_MIX = (("ncf", 503), ("cifar10", 495), ("bert", 86), ("deepspeech2", 111), ("yolov3", 59), ("imagenet", 26))
#: total batch per GPU asked for, as in those workloads (cifar10: 128 on 1 GPU, 512 on 4, ...)
BATCH_PER_GPU = {"bert": 12, "cifar10": 128, "deepspeech2": 20, "imagenet": 200, "ncf": 256, "yolov3": 8}
JOBS_PER_HOUR_PER_64_GPUS = 20.0
#: each model's configurations (GPUs, total batch) in the Pollux artifact's tuned workloads (``workloads/``, 1,280
#: jobs), with how many of its jobs use each: a ``style="tuned"`` job draws one in these proportions
TUNED_CONFIGS = {
    "bert": ((6, 384, 23), (8, 384, 18), (12, 384, 20), (16, 384, 25)),
    "cifar10": ((6, 2048, 134), (8, 2048, 119), (12, 4096, 133), (16, 4096, 109)),
    "deepspeech2": ((6, 320, 34), (8, 320, 34), (12, 640, 43)),
    "imagenet": ((24, 3200, 9), (32, 6400, 9), (48, 6400, 8)),
    "ncf": ((1, 32768, 503),),
    "yolov3": ((4, 64, 59),),
}
STYLES = ("realistic", "tuned")


@functools.cache
def philly_jobs() -> tuple[np.ndarray, np.ndarray]:
    """(GPUs, duration in seconds) of every job of the packaged Philly trace."""
    raw = resources.files("dl2d.workload").joinpath("data/pollux/philly.csv.gz").read_bytes()
    gpus, duration = [], []
    for n, row in enumerate(csv.DictReader(io.StringIO(gzip.decompress(raw).decode())), 2):
        g, d = int(row["num_gpus"]), float(row["duration"])
        if g < 1 or d < 0:
            raise ValueError(f"philly.csv.gz line {n}: a job needs >= 1 GPU and a duration >= 0")
        gpus.append(g)
        duration.append(d)
    return np.array(gpus), np.array(duration)


def generate(num_jobs: int, load: float = 1.0, cluster_gpus: int = 64, seed: int = 0,
             max_gpus: int = 64, style: str = "realistic") -> tuple[WorkloadJob, ...]:
    """A seeded workload (module docstring); the same arguments always give the same jobs. ``style``: "realistic",
    each job as its Philly user submitted it (steps 1-3), or "tuned", the same jobs (the same models and arrivals)
    each given one of its model's configurations in the Pollux artifact's tuned workloads (:data:`TUNED_CONFIGS`,
    in their proportions; GPUs at most ``max_gpus``), as Pollux's evaluation tuned its jobs."""
    if style not in STYLES:
        raise ValueError(f"style must be one of {', '.join(STYLES)}, got {style!r}")
    if num_jobs < 1:
        raise ValueError("a workload needs at least one job (num_jobs >= 1)")
    if not load > 0 or not np.isfinite(load):
        raise ValueError(f"load must be a number > 0, got {load!r}")
    if cluster_gpus < 1 or max_gpus < 1:
        raise ValueError("cluster_gpus and max_gpus must be >= 1")
    rng = np.random.default_rng(seed)
    all_gpus, all_duration = philly_jobs()
    pick = rng.integers(len(all_gpus), size=num_jobs)
    gpus = np.minimum(all_gpus[pick], max_gpus)
    gpu_time = all_gpus[pick] * all_duration[pick]
    counts = np.array([c for _, c in MODEL_MIX], float)
    bounds = np.round(np.cumsum(counts / counts.sum()) * num_jobs).astype(int)
    rank = np.empty(num_jobs, int)
    rank[np.lexsort((rng.random(num_jobs), gpu_time))] = np.arange(num_jobs)  # ties broken at random
    model_of = np.searchsorted(bounds, rank, side="right")
    rate = load * JOBS_PER_HOUR_PER_64_GPUS * cluster_gpus / 64 / 3600  # jobs per second
    arrival = np.cumsum(rng.exponential(1 / rate, num_jobs))
    arrival -= arrival[0]
    tuned_pick = rng.random(num_jobs) if style == "tuned" else None  # drawn last: "realistic" draws as before
    # each model's cumulative share of its tuned configurations, the draw's bins
    tuned_bins = {m: np.cumsum([n for *_, n in menu], dtype=float) / sum(n for *_, n in menu)
                  for m, menu in TUNED_CONFIGS.items()}
    jobs = []
    for i in range(num_jobs):
        model = MODEL_MIX[min(int(model_of[i]), len(MODEL_MIX) - 1)][0]
        g, batch = int(gpus[i]), BATCH_PER_GPU[model] * int(gpus[i])
        if tuned_pick is not None:
            pick = int(np.searchsorted(tuned_bins[model], tuned_pick[i], side="right"))
            g, batch, _ = TUNED_CONFIGS[model][pick]
            g = min(g, max_gpus)
        jobs.append(WorkloadJob(f"philly-{seed}-{i}", float(round(arrival[i])), model, g, batch))
    return tuple(jobs)
