"""Optimus's rule as a pure JAX function (dl2d.policy.target.marginal) gives what the NumPy Optimus gives, where
aggregate capacity is the placement's (one server), and never more than the cluster holds; so does its relative
variant (RelativeOptimus)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dl2d.policy.target.marginal import optimus_counts
from dl2d.policy.baselines.optimus import Optimus, RelativeOptimus
from dl2d.sim.cluster import ClusterSpec
from dl2d.workload.jobtypes import TYPE_NAMES
from tests.testkit.sim import make_view

ROWS = 8  # one padded shape, one compilation
COUNTS = jax.jit(optimus_counts, static_argnames="relative")


def _counts(view, relative=False):
    n = len(view)
    pad = lambda a, fill=0: np.concatenate([np.asarray(a), np.full((ROWS - n, *np.shape(a)[1:]), fill,  # noqa: E731
                                                                       np.asarray(a).dtype)])
    w, p = COUNTS(jnp.asarray(pad(view.est_speed), jnp.float32), jnp.asarray(pad(view.remaining_epochs), jnp.float32),
                  jnp.asarray(pad(view.worker_demand), jnp.float32), jnp.asarray(pad(view.ps_demand), jnp.float32),
                  jnp.asarray(pad(view.allreduce, False)), jnp.asarray(pad(np.ones(n, bool), False)),
                  jnp.asarray(pad(view.arrival_slot), jnp.int32), jnp.asarray(view.total_capacity, jnp.float32), relative=relative)
    return np.asarray(w), np.asarray(p)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_on_one_server_it_is_the_numpy_optimus(data):
    relative = data.draw(st.booleans())
    n = data.draw(st.integers(1, ROWS))
    # bundles mostly fit, and then the marginal tasks contend for what is left (sizes tried by hand)
    spec = ClusterSpec(1, gpus=data.draw(st.sampled_from([4.0, 8.0, 16.0])),
                       cpus=data.draw(st.sampled_from([16.0, 20.0, 28.0, 40.0])),
                       mem_gb=data.draw(st.sampled_from([64.0, 128.0])))
    types = data.draw(st.lists(st.sampled_from(TYPE_NAMES), min_size=n, max_size=n))
    est = data.draw(st.lists(st.floats(1, 300), min_size=n, max_size=n))
    done = [e * data.draw(st.floats(0, 0.99)) for e in est]
    arrival = sorted(data.draw(st.lists(st.integers(0, 20), min_size=n, max_size=n)))
    view = make_view(types, spec=spec, arrival=arrival, est=est, done=done, max_workers=8, max_ps=8)
    want = (RelativeOptimus() if relative else Optimus())(view)
    w, p = _counts(view, relative)
    np.testing.assert_array_equal(w[:n], want.workers)
    np.testing.assert_array_equal(p[:n], want.ps)
    assert np.all(w[n:] == 0) and np.all(p[n:] == 0)
    used = (w[:n, None] * view.worker_demand + p[:n, None] * view.ps_demand).sum(axis=0)
    assert np.all(used <= view.total_capacity + 1e-4)


def test_the_relative_rule_gives_the_short_job_what_optimus_gives_the_long():
    """Two jobs of one type, one with ten times the other's epochs left, and cores for two PS beyond their
    bundles (no GPU for a worker): Optimus gives both to the long job (each cuts more seconds there), the
    relative rule one to each (the same speed-up is the same share of either job's time)."""
    spec = ClusterSpec(1, gpus=3.0, cpus=12.0, mem_gb=128.0)
    view = make_view(["resnet-50", "resnet-50"], spec=spec, arrival=[0, 0], est=[10.0, 100.0], done=[0.0, 0.0],
                     max_workers=8, max_ps=8)
    opt, rel = Optimus()(view), RelativeOptimus()(view)
    assert list(opt.workers) == list(rel.workers) == [1, 1]
    assert list(opt.ps) == [1, 3] and list(rel.ps) == [2, 2]
    for relative, want in ((False, opt), (True, rel)):
        w, p = _counts(view, relative)
        assert list(w[:2]) == list(want.workers) and list(p[:2]) == list(want.ps)
