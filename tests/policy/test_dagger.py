"""DAgger (dl2d/policy/dagger.py): teacher labels at any partial state of a slot, set labels, refit."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from testkit.policy import tiny_trace

from dl2d.policy import dagger as D
from dl2d.policy import learn as LN
from dl2d.policy.registry import make_heuristic
from dl2d.policy.scheduler import decide
from dl2d.sim import engine as E


@pytest.fixture(scope="module")
def trace():
    return tiny_trace(12, seed=2, max_epochs=30)


def test_labels_replay_teacher_mode(cfg, sim, params, trace):
    """On the teacher's own trajectory the per-state label is exactly the action teacher mode took, and it is
    in the good set; void is good only when nothing else is."""
    state = E.replace(E.SimState.initial(len(trace)), slot=int(trace.arrival_slot.min()))
    rng, total = np.random.default_rng(0), 0
    for k in range(2):
        view = E.view_of(trace, state, sim)
        t = make_heuristic("optimus")(view)
        d = decide(cfg, params, jax.random.PRNGKey(k), view, mode="teacher", targets=(t.workers, t.ps), record=True)
        for i, r in enumerate(d.records):
            tw, tu = D._window_targets(cfg, t, i, len(view))
            s, m = jnp.asarray(r.states), jnp.asarray(r.masks)
            lab = np.asarray(D.teacher_labels(cfg, s, m, tw, tu))
            good = np.asarray(D.teacher_sets(cfg, s, m, tw, tu))
            np.testing.assert_array_equal(lab, r.actions)
            assert good[np.arange(len(lab)), lab].all()
            assert not (good[:, -1] & good[:, :-1].any(axis=1)).any()
            assert not (good & ~r.masks).any()
            total += len(lab)
        state, _, _ = E.step(trace, state, d.allocation, sim, rng)
    assert total > 0


def test_set_loss_is_cross_entropy_for_one_hot(cfg, params, trace, sim):
    s, m, a, _ = D.collect(cfg, params, trace, sim, "optimus", driver="teacher", max_slots=2)
    one_hot = np.eye(cfg.num_actions, dtype=bool)[a]
    got = float(D.set_loss(cfg, params, jnp.asarray(s), jnp.asarray(m), jnp.asarray(one_hot)))
    want = float(LN.sl_loss(cfg, params, jnp.asarray(s), jnp.asarray(m), jnp.asarray(a)))
    assert got == pytest.approx(want, rel=1e-5)


def test_dagger_round_collects_learner_states_and_fits(cfg, params, trace, sim):
    data = D.collect(cfg, params, trace, sim, "optimus", driver="teacher", max_slots=2)
    p, _, losses = D.fit(cfg, params, data, 3, labels="set")
    assert losses[-1] < losses[0] and np.isfinite(losses).all()
    seen = []
    p2, agg = D.dagger(cfg, p, data, [tiny_trace(8, seed=3, max_epochs=20)], sim, iterations=1, epochs=1,
                       max_slots=2, on_iter=lambda it, new, n, loss, _p: seen.append((new, n, loss)))
    assert len(seen) == 1 and seen[0][0] > 0 and seen[0][1] == len(data[2]) + seen[0][0]
    assert len(agg[2]) == seen[0][1] and agg[3].shape == (seen[0][1], cfg.num_actions)
    assert 0.0 <= D.set_accuracy(cfg, p2, agg) <= 1.0
    with pytest.raises(ValueError):
        D.collect(cfg, params, trace, sim, driver="nope")
