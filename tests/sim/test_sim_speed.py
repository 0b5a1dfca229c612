"""The speed model: the authors' measurements, their interpolation, and the parametric (Optimus-style) fit.

The properties DL2 Fig. 1-2 rely on are checked on the tables the simulator uses: diminishing returns in
workers, and a best PS:worker ratio that differs between models.
"""
from __future__ import annotations

import numpy as np
import pytest

from dl2d.workload import speed as S
from dl2d.workload.jobtypes import TYPE_NAMES

T = TYPE_NAMES.index


@pytest.fixture(scope="module")
def measured():
    return S.measured_table()


@pytest.fixture(scope="module")
def parametric():
    return S.parametric_table()


def test_parse_speed_lines_sums_the_workers_speeds():
    lines = ["('resnet-50', 'dist_sync', 32, 2, 3, [1.5, 2.0, 2.5], [1.0, 1.0], [0.5, 0.5, 0.5])", "",
             "('wlm', 'dist_sync', 32, 1, 1, [7.0], [1.0], [0.5])"]
    assert S.parse_speed_lines(lines) == {"resnet-50": [(2, 3, 6.0)], "wlm": [(1, 1, 7.0)]}


@pytest.mark.parametrize("line, message", [
    ("__import__('os').system('true')", "line 1: not a valid record"),
    ("('wlm', 'dist_sync', 32, 1, 2, [7.0], [1.0], [0.5])", "line 1: 2 workers but 1 speeds"),
    ("('wlm', 'dist_sync', 32, 1)", "line 1: not a valid record"),
])
def test_parse_speed_lines_rejects_bad_records_naming_the_line(line, message):
    with pytest.raises(ValueError, match=message):
        S.parse_speed_lines([line])


def test_the_shipped_data_covers_the_eight_models():
    m = S.measurements()
    assert set(m) == set(TYPE_NAMES)
    assert {n: len(m[n]) for n in ("resnet-50", "vgg-16", "dssm", "wlm")} == \
        {"resnet-50": 210, "vgg-16": 210, "dssm": 78, "wlm": 57}


def test_measured_table_goes_through_every_measurement_and_is_zero_without_ps_or_workers(measured):
    assert measured.shape == (8, S.TABLE_MAX + 1, S.TABLE_MAX + 1)
    assert np.all(measured[:, 0, :] == 0) and np.all(measured[:, :, 0] == 0)
    assert np.all(measured[:, 1:, 1:] > 0)
    for t, name in enumerate(TYPE_NAMES):
        for p, w, s in S.measurements()[name]:
            if s > 0:  # 0 = a failed run in the data, dropped
                assert measured[t, p, w] == pytest.approx(s, rel=1e-9), (name, p, w)


def test_outside_the_measured_grid_the_nearest_measurement_is_used(measured):
    t = T("wlm")  # measured up to 11 workers: more workers get the speed of the nearest measured point
    points = {(p, w): s for p, w, s in S.measurements()["wlm"]}
    assert max(w for _, w in points) == 11
    assert measured[t, 1, 20] == pytest.approx(points[(1, 11)])
    # lookups beyond the table are clamped to its edge
    assert S.lookup(measured, np.array([t]), np.array([100]), np.array([100]))[0] == measured[t, 32, 32]


def test_diminishing_returns_in_workers(measured):
    """DL2 Fig. 1: with one PS per worker, speed grows far less than linearly and then flattens or drops."""
    for t, name in enumerate(TYPE_NAMES):
        diag = np.array([measured[t, k, k] for k in range(1, 13)])
        per_worker = diag / np.arange(1, 13)
        assert per_worker[-1] < 0.3 * per_worker[0], name  # 12 workers: each under 30% of a lone worker's speed
        assert np.all(np.diff(per_worker[:5]) < 0), name  # and every added worker lowers the per-worker speed
        # doubling the workers (each count with its best PS number) never doubles the speed
        best = measured[t, 1:, 1:17].max(axis=0)
        assert np.all(best[1::2][:8] < 2 * best[:8]), name
    # the raw data says the same for ResNet-50: (1, 1) 15.8 steps/s, (12, 12) only about twice that
    raw = {(p, w): s for p, w, s in S.measurements()["resnet-50"]}
    assert raw[(12, 12)] < 2.5 * raw[(1, 1)]


def best_split(table, t, budget=12):
    return max(((table[t, p, budget - p], p) for p in range(1, budget)))[1]


def test_best_ps_to_worker_ratio_depends_on_the_model(measured):
    """DL2 Fig. 2: with 12 tasks to split, the best number of PS differs per model."""
    best = {name: best_split(measured, t) for t, name in enumerate(TYPE_NAMES)}
    assert len(set(best.values())) >= 3, best
    assert best["resnet-50"] >= 9  # PS-heavy: ResNet-50 and VGG-16 are communication bound here
    assert best["vgg-16"] >= 9
    assert best["cnn-text-classification"] <= 7  # balanced: about one PS per worker
    assert best["dssm"] <= 7
    # and the best split is much faster than the worst one
    for t, name in enumerate(TYPE_NAMES):
        row = [measured[t, p, 12 - p] for p in range(1, 12)]
        assert max(row) > 1.3 * min(row), name


def test_parametric_model_is_the_fitted_formula(parametric):
    m = S.measurements()
    for t, name in enumerate(TYPE_NAMES):
        theta = S.fit_parametric(m[name])
        assert theta.shape == (5,) and np.all(theta >= 0)
        for p, w in ((1, 1), (3, 7), (16, 2)):
            step = theta @ [1 / w, 1, w / p, w, p]
            assert parametric[t, p, w] == pytest.approx(w / step)
    assert np.all(parametric[:, 0, :] == 0) and np.all(parametric[:, :, 0] == 0)


def test_parametric_model_fits_the_measurements_roughly(parametric):
    for t, name in enumerate(TYPE_NAMES):
        pts = [(p, w, s) for p, w, s in S.measurements()[name] if s > 0]
        err = np.array([abs(parametric[t, p, w] - s) / s for p, w, s in pts])
        assert np.median(err) < 0.25, name
    # it is smooth where the data is noisy: more PS never slows DSSM down in the fit
    assert np.all(np.diff(parametric[T("dssm"), 1:17, 8]) >= -1e-9)


def test_speed_table_by_name():
    assert S.speed_table() is S.measured_table()
    assert S.speed_table("parametric") is S.parametric_table()
    with pytest.raises(ValueError, match="unknown speed model 'optimus'; choose one of measured, parametric"):
        S.speed_table("optimus")
