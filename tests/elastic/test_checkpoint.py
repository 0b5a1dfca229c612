import os
import time

import numpy as np
import pytest
from testkit.elastic import assert_matches_reference, long_cfg

from dl2d.elastic.checkpoint import load_checkpoint, save_checkpoint


def test_atomic_save_and_load(tmp_path):
    p = np.arange(5, dtype=np.float32)
    m = np.ones(5, np.float32)
    path = save_checkpoint(str(tmp_path), {"version": 3, "epoch": 0}, p, m)
    assert os.path.basename(path) == "checkpoint.npz"
    meta, p2, m2 = load_checkpoint(str(tmp_path))
    assert meta["version"] == 3
    np.testing.assert_array_equal(p, p2)
    np.testing.assert_array_equal(m, m2)
    assert [f for f in os.listdir(tmp_path) if f.startswith(".tmp")] == []


def test_failed_save_keeps_previous_checkpoint(tmp_path):
    save_checkpoint(str(tmp_path), {"version": 1}, np.zeros(3, np.float32), np.zeros(3, np.float32))
    bad = np.array([1, np.nan, 2], np.float32)
    with pytest.raises(ValueError):
        save_checkpoint(str(tmp_path), {"version": 2}, bad, bad)
    assert load_checkpoint(str(tmp_path))[0]["version"] == 1
    assert load_checkpoint(str(tmp_path / "none")) is None


def test_checkpoint_exit_and_resume_with_new_size(tmp_path, make_cluster):
    cfg = long_cfg()
    c = make_cluster(cfg, 2, 2, checkpoint_dir=str(tmp_path))
    while c.coord.version < 20:
        time.sleep(0.01)
    r = c.coord.request("checkpoint", True)
    assert c.wait(10) == "checkpointed"
    v = r["version"]
    assert 20 <= v < cfg.total_steps
    meta, p, m = load_checkpoint(str(tmp_path))
    assert meta["version"] == v and meta["epoch"] == v // cfg.steps_per_epoch
    assert meta["step_in_epoch"] == v % cfg.steps_per_epoch and meta["data_position"] == v
    assert np.abs(m).sum() > 0  # optimizer state is saved
    # relaunch with another size: resumes at the same step and ends on the reference model
    c2 = make_cluster(cfg, 3, 1, checkpoint_dir=str(tmp_path))
    assert c2.coord.start_version == v
    assert c2.wait(60) == "done", c2.coord.errors
    assert_matches_reference(cfg, c2.coord.final_params)
    assert os.path.exists(tmp_path / "model.npz")


def test_checkpoint_restart_resize_through_coordinator(tmp_path, make_cluster):
    cfg = long_cfg()
    c = make_cluster(cfg, 1, 1, checkpoint_dir=str(tmp_path))
    while c.coord.version < 10:
        time.sleep(0.01)
    res = c.coord.scale(2, 3, method="checkpoint_restart")
    assert res["method"] == "checkpoint_restart"
    rec = res["records"][0]
    assert rec["ps_after"] == 3 and rec["workers_after"] == 2 and len(rec["suspension_s"]) == 2
    assert c.wait(60) == "done", c.coord.errors
    assert_matches_reference(cfg, c.coord.final_params)
