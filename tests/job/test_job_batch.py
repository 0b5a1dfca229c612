"""The job's side of an adaptive batch (dl2d.job.batch): the split of the total dl2d gives it (the rule the twin
trains by), the gradient noise it measures from its own gradients, and the learning-rate scale."""
from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from dl2d.job import batch as JB
from dl2d.workload import batching


def test_the_job_splits_a_total_batch_as_the_twin_does():
    for model, total, gpus in (("yolov3", 64, 4), ("bert", 384, 12), ("cifar10", 100, 3), ("ncf", 32768, 1)):
        lim = batching.limits(model)
        p = JB.plan(total, gpus, lim.max_local, lim.max_total)
        assert (p.per_worker, p.accumulation_steps) == batching.split(total, gpus, lim)
        assert p.per_worker <= lim.max_local and p.total <= lim.max_total
    assert JB.plan(64, 4, 8) == JB.BatchPlan(8, 1, 4) and JB.plan(64, 4, 8).total == 64
    with pytest.raises(ValueError, match="whole number of GPUs"):
        JB.plan(64, 0, 8)


def noisy_step(rng, g, sigma, passes, b):
    """Squared norms of ``passes`` gradients of ``b`` samples each (per-sample noise sigma in every coordinate)
    and of their mean."""
    grads = g + rng.normal(0.0, sigma / math.sqrt(b), (passes, g.size))
    return [float(x @ x) for x in grads], float(grads.mean(0) @ grads.mean(0))


@pytest.mark.parametrize("passes", [2, 8])
def test_the_noise_it_measures_is_the_gradients_own(passes):
    """|G|^2 = 4 and tr(S) = 50 x 9 = 450 per sample: at an initial batch of 32 the variance is 450 / 32."""
    rng = np.random.default_rng(0)
    g = np.full(50, 2.0 / math.sqrt(50))
    noise = JB.GradientNoise(init_batch=32, smoothing=0.995)
    for _ in range(3000):
        noise.update(*noisy_step(rng, g, 3.0, passes, 16), 16)
    assert noise.sqr == pytest.approx(4.0, rel=0.15) and noise.var == pytest.approx(450 / 32, rel=0.1)
    assert noise.gain(32) == pytest.approx(1.0)
    gains = [noise.gain(m) for m in (64, 256, 4096)]
    assert 1 < gains[0] < gains[1] < gains[2] < 4096 / 32
    # what the noise says of a larger batch is what Pollux's model says of these statistics
    s = 256 / 32
    assert gains[1] == pytest.approx((noise.var + noise.sqr) / (noise.var / s + noise.sqr))


def test_the_learning_rate_follows_the_rule_asked_for():
    noise = JB.GradientNoise(init_batch=32)
    assert JB.lr_scale(128, 32, noise) == 1.0  # nothing measured yet: the rate as tuned
    rng = np.random.default_rng(1)
    g = np.full(10, 1.0)
    for _ in range(50):
        noise.update(*noisy_step(rng, g, 1.0, 4, 8), 8)
    assert 1 < JB.lr_scale(128, 32, noise) <= 4
    assert JB.lr_scale(128, 32, rule="linear") == 4 and JB.lr_scale(128, 32, rule="sqrt") == 2
    with pytest.raises(ValueError, match="rule must be"):
        JB.lr_scale(128, 32, rule="cubic")
    with pytest.raises(ValueError, match="at least two gradients"):
        noise.update([1.0], 1.0, 8)
    with pytest.raises(ValueError, match="finite"):
        noise.update([1.0, math.nan], 1.0, 8)


def test_it_loads_no_numerical_library():
    """Training scripts import dl2d.job before their framework: it stays pure Python."""
    code = "import sys, dl2d.job.batch; print(sorted(m for m in ('numpy', 'scipy', 'jax') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
