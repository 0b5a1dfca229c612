"""The all-reduce throughput lookup on the packaged Pollux measurements: every measured point reproduced,
monotone where the measurements are, packed vs spread as measured, a fit that stays close to the data, and
malformed files rejected with the line named."""
from __future__ import annotations

import numpy as np
import pytest

from dl2d.workload import throughput as T


@pytest.mark.parametrize("model", T.MODELS)
def test_every_measured_point_is_reproduced(model):
    m, tm = T.measurements(model), T.throughput_model(model)
    assert len(m) > 100
    means: dict = {}
    for p, b, t in zip(m.placements, m.local_bsz, m.step_time):
        means.setdefault((p, float(b)), []).append(t)
    for (p, b), ts in means.items():
        assert tm.step_time(p, b) == pytest.approx(np.mean(ts), rel=1e-12)
        assert tm.step_time(tuple(reversed(p)), b) == tm.step_time(p, b)  # the same job, nodes in any order


@pytest.mark.parametrize("model", T.MODELS)
def test_monotone_where_the_measurements_are_and_beyond(model):
    tm = T.throughput_model(model)
    for p, (xs, ys, _) in tm.points.items():
        for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
            for w in (0.25, 0.5, 0.75):
                y = tm.step_time(p, x0 + w * (x1 - x0))
                assert min(y0, y1) - 1e-12 <= y <= max(y0, y1) + 1e-12
        below, above = [tm.step_time(p, x) for x in (xs[0] / 2, xs[0] / 4)], \
            [tm.step_time(p, x) for x in (2 * xs[-1], 4 * xs[-1])]
        assert below[0] >= below[1] - 1e-12 and above[1] >= above[0] - 1e-12  # more samples per GPU: no faster


@pytest.mark.parametrize("model", T.MODELS)
def test_packed_versus_spread_as_measured(model):
    """Where 2-4 GPUs were measured both on one node and one per node at the same local batches, the lookup
    orders them as the data does, also halfway between two measured batches where both neighbours agree."""
    tm = T.throughput_model(model)
    checked = 0
    for k in (2, 3, 4):
        packed, spread = tm.points.get((k,)), tm.points.get((1,) * k)
        if not packed or not spread:
            continue
        common = sorted(set(packed[0]) & set(spread[0]))
        faster = [tm.step_time((k,), b) < tm.step_time((1,) * k, b) for b in common]
        for (b0, f0), (b1, f1) in zip(zip(common, faster), zip(common[1:], faster[1:])):
            if f0 == f1:
                mid = (b0 + b1) / 2
                assert (tm.step_time((k,), mid) < tm.step_time((1,) * k, mid)) == f0
                checked += 1
    assert checked > 0
    bert = T.throughput_model("bert")
    assert bert.throughput((2,), 24) > 1.5 * bert.throughput((1, 1), 24)  # README: 26 vs 16 samples/s


@pytest.mark.parametrize("model", T.MODELS)
def test_the_fit_stays_close_to_every_models_data(model):
    m, fit = T.measurements(model), T.throughput_model(model).fit
    gpus = [sum(p) for p in m.placements]
    nodes = [len(p) for p in m.placements]
    err = np.abs(np.log(fit.step_time(gpus, nodes, m.local_bsz) / m.step_time))
    assert np.median(err) < 0.1 and np.quantile(err, 0.9) < 0.3
    assert fit.beta_grad >= 0 and fit.gamma >= 1


def test_placements_and_spreads():
    assert T.canonical([0, 1, 3]) == (3, 1)
    assert T.even_spread(7, 3) == (3, 2, 2)
    with pytest.raises(ValueError, match="at least one GPU"):
        T.canonical([0, 0])
    with pytest.raises(ValueError, match="cannot spread 2 GPUs over 3 nodes"):
        T.even_spread(2, 3)
    with pytest.raises(ValueError, match="no throughput measurements for model 'gpt'"):
        T.throughput_model("gpt")
    with pytest.raises(ValueError, match="local batch must be > 0"):
        T.throughput_model("bert").step_time((1,), 0)


@pytest.mark.parametrize("text, message", [
    ("placement,local_bsz\n1,4\n", "missing column(s) step_time"),
    ("placement,local_bsz,step_time,sync_time\n1,4,0.5,0\n1x,4,0.5,0\n", "line 3: placement must be digits"),
    ("placement,local_bsz,step_time,sync_time\n00,4,0.5,0\n", "line 2: a placement needs at least one GPU"),
    ("placement,local_bsz,step_time,sync_time\n1,4,fast,0\n", "line 2: step_time is not a number: 'fast'"),
    ("placement,local_bsz,step_time,sync_time\n1,-4,0.5,0\n", "line 2: local_bsz must be a finite number > 0"),
])
def test_malformed_placement_files_name_the_line(text, message):
    with pytest.raises(ValueError, match=f"x.csv.*{message}".replace("(", r"\(").replace(")", r"\)")):
        T.parse_placements(text, "x.csv")


def test_malformed_scalability_rows_name_the_line():
    with pytest.raises(ValueError, match=r"s.csv line 2: cannot spread 2 GPUs over 3 nodes"):
        T.parse_scalability("num_nodes,num_replicas,local_bsz,step_time,sync_time\n3,2,8,0.5,0.1\n", "s.csv")
