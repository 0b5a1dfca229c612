"""Helpers of the elastic tests: small training configs and the single-process reference run."""
import numpy as np

from dl2d.elastic.model import TrainConfig, grad_sum, make_dataset, reference_train


def long_cfg(**kw):
    """Enough steps that scaling events land mid-training (about 2 ms/step here)."""
    base = dict(n_samples=2048, global_batch=16, epochs=2, d_in=8, hidden=24, d_out=2, max_block=40)
    base.update(kw)
    return TrainConfig(**base)


def assert_matches_reference(cfg, params, start=0, start_state=None):
    p0, m0 = start_state if start_state else (None, None)
    ref, _ = reference_train(cfg, start, cfg.total_steps, p0, m0)
    np.testing.assert_allclose(params, ref, rtol=2e-4, atol=2e-5)


def full_loss(cfg, params):
    X, Y = make_dataset(cfg)
    return grad_sum(cfg, params, X, Y)[1] / len(X)
