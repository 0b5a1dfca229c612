import numpy as np

from dl2d.elastic.model import (TrainConfig, batch_indices, grad_sum, init_params, make_dataset,
                                parse_size, reference_train, worker_slice)


def test_parse_size_and_model_size():
    assert parse_size("25M") == 25_000_000 and parse_size("64k") == 64_000 and parse_size("12") == 12
    cfg = TrainConfig.for_model_size(1_000_000)
    assert abs(cfg.n_params - 1_000_000) < 100
    assert sum(ln for _, ln in cfg.blocks()) == cfg.n_params


def test_gradient_matches_finite_differences():
    cfg = TrainConfig(d_in=3, hidden=4, d_out=2, n_samples=8)
    X, Y = make_dataset(cfg)
    p = init_params(cfg).astype(np.float64)
    g, _ = grad_sum(cfg, p, X.astype(np.float64), Y.astype(np.float64))
    eps = 1e-6
    for i in [0, 5, 12, 13, 20, cfg.n_params - 1]:
        d = np.zeros_like(p)
        d[i] = eps
        num = (grad_sum(cfg, p + d, X, Y)[1] - grad_sum(cfg, p - d, X, Y)[1]) / (2 * eps)
        assert abs(num - g[i]) < 1e-4 * max(1, abs(num))


def test_worker_split_sums_to_full_batch_gradient():
    cfg = TrainConfig()
    X, Y = make_dataset(cfg)
    p = init_params(cfg)
    idx = batch_indices(cfg, 3)
    full = grad_sum(cfg, p, X[idx], Y[idx])[0]
    for w in (2, 3, 5):
        parts = sum(grad_sum(cfg, p, X[s], Y[s])[0] for s in (worker_slice(idx, r, w) for r in range(w)))
        np.testing.assert_allclose(parts, full, rtol=1e-5, atol=1e-5)


def test_data_order_is_a_permutation_per_epoch():
    cfg = TrainConfig(n_samples=100, global_batch=10)
    seen = np.concatenate([batch_indices(cfg, s) for s in range(10)])
    assert sorted(seen) == list(range(100))
    assert not np.array_equal(batch_indices(cfg, 0), batch_indices(cfg, 10))


def test_reference_training_reduces_loss_and_is_split_independent():
    cfg = TrainConfig(epochs=3)
    X, Y = make_dataset(cfg)
    p0 = init_params(cfg)
    p1, _ = reference_train(cfg, 0, cfg.total_steps)
    p3, _ = reference_train(cfg, 0, cfg.total_steps, n_split=3)
    l0 = grad_sum(cfg, p0, X, Y)[1]
    assert grad_sum(cfg, p1, X, Y)[1] < 0.5 * l0
    np.testing.assert_allclose(p1, p3, rtol=1e-4, atol=1e-5)
