"""A total batch on some GPUs: the per-GPU cap, gradient accumulation beyond it, and the step time it costs
(dl2d.workload.batching), and the sync share of the measured step it is built on (dl2d.workload.throughput)."""
from __future__ import annotations

import pytest

from dl2d.workload import batching as B
from dl2d.workload import throughput as T


def test_the_limits_are_the_measurements_and_the_artifacts_yolov3_cap():
    assert B.limits("bert") == B.BatchLimits(init=12, max_total=384, min_local=4.0, max_local=12.0)
    assert B.limits("yolov3").max_local == 8.0  # its table goes to 16; the artifact holds 8 a pass
    assert max(T.measurements("yolov3").local_bsz) == 16.0
    assert B.limits("ncf").init == 256 and B.limits("ncf").max_total == 32768


@pytest.mark.parametrize("model, batch, gpus, one_gpu, want", [
    ("yolov3", 64, 4, False, (8, 1)),  # 16 a GPU: two passes of 8
    ("yolov3", 64, 8, False, (8, 0)),
    ("bert", 384, 12, False, (10, 2)),  # 32 a GPU: three passes of 11, cut to 10 to stay within 384 in all
    ("cifar10", 256, 1, False, (256, 0)),
    ("cifar10", 256, 1, True, (128, 1)),  # the artifact's: one GPU beyond the initial batch accumulates
    ("cifar10", 128, 1, True, (128, 0)),  # at the initial batch it does not
    ("cifar10", 100, 3, False, (34, 0)),  # ceil(100 / 3)
])
def test_a_total_batch_is_split_into_passes_no_gpu_holds_more_than_its_cap(model, batch, gpus, one_gpu, want):
    lim = B.limits(model)
    atomic, accum = B.split(batch, gpus, lim, one_gpu)
    assert (atomic, accum) == want
    assert atomic <= lim.max_local and gpus * atomic * (accum + 1) <= lim.max_total


def test_an_accumulation_pass_repeats_the_compute_not_the_synchronisation():
    placement = (4,)
    step, sync = T.throughput_model("yolov3").times(placement, 8.0)
    assert 0 < sync < step
    seconds, trained = B.iteration_seconds("yolov3", placement, 64.0)
    assert seconds == pytest.approx(step + (step - sync)) and trained == 64.0
    assert B.iteration_seconds("yolov3", (4, 4), 64.0) == (T.throughput_model("yolov3").times((4, 4), 8.0)[0], 64.0)


def test_bad_splits_and_sync_times_are_refused():
    with pytest.raises(ValueError, match="total batch"):
        B.split(0, 1, B.limits("bert"))
    with pytest.raises(ValueError, match="line 2: sync_time must lie within"):
        T.parse_placements("placement,local_bsz,step_time,sync_time\n1,8,0.5,0.7\n", "p.csv")
    m = T.parse_placements("placement,local_bsz,step_time\n1,8,0.5\n", "p.csv")  # no column: no sync known
    assert m.sync_time.tolist() == [0.0]


def test_off_table_placements_interpolated_between_the_measurements_or_by_the_fit():
    """A measured placement reads the same either way; one never measured (17 GPUs over 5 nodes) reads
    between the measurements of its neighbours when interpolated, Pollux's fit otherwise."""
    tm = T.throughput_model("cifar10")
    assert tm.times((4, 4), 64.0, "interpolate") == tm.times((4, 4), 64.0, "fit")
    off = (4, 4, 4, 4, 1)
    assert off not in tm.points
    fit, interp = tm.times(off, 64.0, "fit"), tm.times(off, 64.0, "interpolate")
    assert interp != fit and 0 <= interp[1] <= interp[0]
    near = [tm.times(p, 64.0)[0] for p in ((4, 4, 4, 4), (3, 3, 3, 3, 3, 2))]  # 16 on 4 nodes, 17 on 6
    assert min(near) * 0.8 < interp[0] < max(near) * 1.2
    with pytest.raises(ValueError, match="off_table"):
        tm.times(off, 64.0, "guess")
