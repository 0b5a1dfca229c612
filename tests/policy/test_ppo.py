"""The target-size policy and its slot-level PPO (dl2d.policy.target.policy, dl2d.policy.target.ppo): the fill
respects capacity and targets, GAE matches a plain reference, a slot's log-probability is the sum over its
active jobs, the teacher is Optimus's allocation, PPO iterations are finite and learn a tiny case as
well as its best constant allocation (brute force), and vmapped greedy evaluation equals single runs."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dl2d.policy.target import ppo as P
from dl2d.policy.target import policy as T
from dl2d.policy.target import view as TV
from dl2d.policy.elastic.srtf import efficient_sizes
from dl2d.sim import jaxenv as X
from dl2d.sim import trace as TR
from dl2d.sim.worlds import world

CFG = T.TargetConfig(max_workers=8, max_ps=8, hidden=32)
FILL = jax.jit(T.fill, static_argnums=0)


def grid_fill(cfg, workers, ps, active, worker_demand, ps_demand, capacity, order_key):
    """The fill as a search over every (workers, PS) pair of each job, the reference for T.fill's counts."""
    order = jnp.argsort(jnp.where(active, order_key, jnp.inf))
    k = jnp.arange(cfg.max_workers + 1, dtype=worker_demand.dtype)
    q = jnp.arange(cfg.max_ps + 1, dtype=worker_demand.dtype)

    def body(free, j):
        need = (k[:, None, None] * worker_demand[j][None, None, :] + q[None, :, None] * ps_demand[j][None, None, :])
        pair = jnp.where(ps[j] > 0, (k[:, None] == 0) == (q[None, :] == 0), q[None, :] == 0)
        ok = (jnp.all(need <= free[None, None, :] + 1e-6, axis=2) & (k[:, None] <= workers[j])
              & (q[None, :] <= ps[j]) & pair & active[j])
        score = jnp.where(ok, k[:, None] * (cfg.max_ps + 1) + q[None, :], -1.0)
        best = jnp.argmax(score.ravel())
        w, p = jnp.where(score.ravel()[best] >= 0, jnp.array([best // (cfg.max_ps + 1), best % (cfg.max_ps + 1)]), 0)
        w, p = w.astype(worker_demand.dtype), p.astype(worker_demand.dtype)
        return free - w * worker_demand[j] - p * ps_demand[j], (j, w, p)

    _, (idx, w, p) = jax.lax.scan(body, jnp.asarray(capacity, worker_demand.dtype), order)
    zero = jnp.zeros(workers.shape, worker_demand.dtype)
    return zero.at[idx].set(w), zero.at[idx].set(p)


GRID_FILL = jax.jit(grid_fill, static_argnums=0)


#: the fill's sort keys; none subnormal: XLA on the CPU flushes them to 0, so in the fill a key of 1e-45 ties
#: one of 0, where NumPy's order (the second test's) does not
SORT_KEYS = st.floats(0, 100, width=32, allow_subnormal=False)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_the_fill_grants_what_a_search_over_every_pair_grants(data):
    """The fill computes each job's counts; a search over all of them is the reference, on demands and
    capacities drawn from a grid of quarters (where a sum lands exactly on the capacity) and from any float."""
    jobs = 5
    f = data.draw(st.sampled_from([st.floats(0, 4, allow_nan=False, width=32),
                                   st.integers(0, 16).map(lambda n: n / 4)]))
    wd = np.array(data.draw(st.lists(st.tuples(f, f, f), min_size=jobs, max_size=jobs)), np.float32)
    pd = np.array(data.draw(st.lists(st.tuples(st.just(0.0), f, f), min_size=jobs, max_size=jobs)), np.float32)
    target_w = np.array(data.draw(st.lists(st.sampled_from(CFG.levels), min_size=jobs, max_size=jobs)), np.float32)
    target_p = np.array(data.draw(st.lists(st.sampled_from((0, 0.5) + CFG.ps_levels), min_size=jobs,
                                           max_size=jobs)), np.float32)
    active = np.array(data.draw(st.lists(st.booleans(), min_size=jobs, max_size=jobs)))
    cap = np.array(data.draw(st.tuples(f, f, f)), np.float32) * 4
    key = np.array(data.draw(st.lists(SORT_KEYS, min_size=jobs, max_size=jobs)), np.float32)
    args = [jnp.asarray(a) for a in (target_w, target_p, active, wd, pd, cap, key)]
    got, want = FILL(CFG, *args), GRID_FILL(CFG, *args)
    np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_the_fill_never_exceeds_capacity_or_a_target_and_serves_the_shortest_first(data):
    jobs = 5  # one shape, one compilation; inactive rows make fewer jobs
    f = st.floats(0, 4, allow_nan=False, width=32)
    wd = np.array(data.draw(st.lists(st.tuples(f, f, f), min_size=jobs, max_size=jobs)), np.float32)
    pd = np.array(data.draw(st.lists(st.tuples(st.just(0.0), f, f), min_size=jobs, max_size=jobs)), np.float32)
    target_w = np.array(data.draw(st.lists(st.sampled_from(CFG.levels), min_size=jobs, max_size=jobs)), np.float32)
    target_p = np.array(data.draw(st.lists(st.sampled_from((0,) + CFG.ps_levels), min_size=jobs, max_size=jobs)),
                        np.float32)  # 0: an all-reduce job
    active = np.array(data.draw(st.lists(st.booleans(), min_size=jobs, max_size=jobs)))
    cap = np.array(data.draw(st.tuples(f, f, f)), np.float32) * 4
    key = np.array(data.draw(st.lists(SORT_KEYS, min_size=jobs, max_size=jobs)), np.float32)
    w, p = map(np.asarray, FILL(CFG, jnp.asarray(target_w), jnp.asarray(target_p), jnp.asarray(active),
                                  jnp.asarray(wd), jnp.asarray(pd), jnp.asarray(cap), jnp.asarray(key)))
    used = (w[:, None] * wd + p[:, None] * pd).sum(axis=0)
    assert np.all(used <= cap + 1e-4), (used, cap)
    assert np.all(w <= target_w) and np.all(p <= target_p) and np.all(w[~active] == 0) and np.all(p[~active] == 0)
    ps_job = target_p > 0
    assert np.all((w[ps_job] == 0) == (p[ps_job] == 0)) and np.all(p[~ps_job] == 0)  # PS only beside workers
    # the first job in order gets its targets whenever they fit the empty cluster
    order = [j for j in np.argsort(np.where(active, key, np.inf), kind="stable") if active[j]]
    if order:
        j = order[0]
        fits = np.all(target_w[j] * wd[j] + target_p[j] * pd[j] <= cap + 1e-6)
        if fits and np.sum(key[active] == key[j]) == 1 and (target_w[j] > 0 or not ps_job[j]):
            assert (w[j], p[j]) == (target_w[j], target_p[j])


def test_gae_matches_a_plain_reference():
    rng = np.random.default_rng(0)
    T_, N = 7, 3
    r, v = rng.normal(size=(T_, N)).astype(np.float32), rng.normal(size=(T_, N)).astype(np.float32)
    d = rng.random((T_, N)) < 0.3
    last = rng.normal(size=N).astype(np.float32)
    pc = P.PPOConfig(gamma=0.9, gae_lambda=0.8)
    adv, ret = map(np.asarray, P.gae(pc, jnp.asarray(r), jnp.asarray(v), jnp.asarray(d), jnp.asarray(last)))
    want = np.zeros((T_, N))
    for n in range(N):
        a, nv = 0.0, last[n]
        for t in reversed(range(T_)):
            nonterm = 0.0 if d[t, n] else 1.0
            delta = r[t, n] + 0.9 * nv * nonterm - v[t, n]
            a = delta + 0.9 * 0.8 * nonterm * a
            want[t, n], nv = a, v[t, n]
    np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want + v, rtol=1e-5, atol=1e-5)


def test_a_slots_log_probability_sums_the_active_jobs_and_allreduce_jobs_choose_no_ps_ratio():
    net = T.init_params(CFG, jax.random.PRNGKey(1))
    x = jax.random.normal(jax.random.PRNGKey(2), (5, CFG.feature_dim))
    active = jnp.array([True, True, False, True, False])
    allreduce = jnp.array([True, False, False, False, True])
    logits, value = T.apply(CFG, net, x, active, allreduce)
    assert logits.shape == (5, CFG.num_actions) and value.shape == (5,)
    assert np.all(np.asarray(value)[~np.asarray(active)] == 0.0)  # an inactive job has no value
    probs = jax.nn.softmax(logits)
    ps_index = np.arange(CFG.num_actions) % len(CFG.ps_levels)
    assert float(jnp.sum(probs[0][ps_index > 0])) < 1e-6 and float(jnp.sum(probs[1][ps_index > 0])) > 1e-3
    a = jnp.array([3, 4, 5, 6, 7])
    lp = jax.nn.log_softmax(logits)
    assert float(P.log_prob(logits, a, active)) == pytest.approx(float(lp[0, 3] + lp[1, 4] + lp[3, 6]), rel=1e-6)
    n_ps = len(CFG.ps_levels)
    w, p = T.sizes(CFG, jnp.array([0, n_ps + 1, 2 * n_ps + 2, 6 * n_ps + n_ps - 1, n_ps]), allreduce)
    assert np.asarray(w).tolist() == [CFG.levels[0], CFG.levels[1], CFG.levels[2], CFG.levels[6], CFG.levels[1]]
    assert np.asarray(p).tolist() == [0, CFG.ps_levels[1], CFG.ps_levels[2], CFG.ps_levels[-1], 0]


def test_the_demand_features_sizes_are_the_elastic_heuristics_efficient_size_on_the_levels():
    rng = np.random.default_rng(3)
    curves = np.cumsum(rng.random((50, CFG.num_levels)) * rng.random((50, 1)), axis=1)
    curves[:, 0] = 0.0
    curves[rng.random(50) < 0.3, 4:] *= 0.5  # some curves that fall
    got = np.asarray(T.elastic_sizes(CFG, jnp.asarray(curves, jnp.float32)))
    lv = np.array(CFG.levels, float)
    for j in range(50):  # the rule itself, written out
        c = curves[j]
        good = [i for i in range(1, len(lv)) if c[i] >= T.ELASTIC_EFFICIENCY * lv[i] * c[1] and c[i] > c[:i].max()]
        assert got[j] == (lv[max(good)] if good else 1.0), (j, c)
    # on the full curve (every k is a level) it is the heuristic's own function
    full = T.TargetConfig(max_workers=4)
    assert full.levels == (0, 1, 2, 3, 4)
    c4 = curves[:, :5]
    np.testing.assert_array_equal(np.asarray(T.elastic_sizes(full, jnp.asarray(c4, jnp.float32))),
                                  efficient_sizes(c4, T.ELASTIC_EFFICIENCY))


def _tiny(clusters: int):
    """One ResNet-50 PS job alone on the DL2 testbed (13 servers), up to 4 workers and 4 PS: the best constant
    action is found by brute force."""
    cfg = world("dl2").sim_config("testbed")
    trace = TR.Trace(arrival_slot=np.array([0]), type_idx=np.array([0]), true_epochs=np.array([3.0]),
                     est_epochs=np.array([3.0]), speed_factor=np.array([1.0]))
    env, states = X.from_traces([trace] * clusters, cfg, 1, placement=False)
    return env, states, T.TargetConfig(max_workers=4, max_ps=4, hidden=32)


def _constant_jcts(env, states, tc) -> np.ndarray:
    """[actions] the JCT of the tiny job when every slot takes the same action."""

    @jax.jit
    def run(action):
        def body(s, _):
            obs = P.env_obs(tc, env, s)
            w, p = P.allocate(tc, obs, jnp.full(obs["active"].shape, action))
            return X.step(env, s, w, p)[0], None

        return jnp.nanmean(X.jct(jax.lax.scan(body, X.unstack(states, 0), None, length=60)[0]))

    return np.asarray(jax.vmap(run)(jnp.arange(tc.num_actions)))


def test_ppo_iterations_are_finite_and_learn_a_tiny_case_as_well_as_its_best_constant_allocation():
    """The best constant action (brute force over every action) is the bar; a random start is far from it, 40
    iterations reach it (a policy may also change size between slots, and do better)."""
    env, states, tc = _tiny(16)
    jcts = _constant_jcts(env, states, tc)
    best = float(np.nanmin(jcts))  # NaN: an action that never finishes the job (no worker)
    pc = P.PPOConfig(clusters=16, slots=16, lr=3e-3, ent_coef=0.0, minibatches=2)
    runner = P.init_runner(tc, pc, states, jax.random.PRNGKey(0))
    def greedy(net) -> float:  # the job unfinished after 60 slots (a random start may keep it waiting): inf
        return float(np.nan_to_num(np.mean(np.asarray(jax.vmap(X.jct)(P.evaluate(tc, env, net, states, 60)))),
                                   nan=np.inf))

    start = greedy(runner[0])
    for _ in range(40):
        runner, stats = P.train_step(tc, pc, env, runner)
        assert all(np.isfinite(float(v)) for v in stats.values()), stats
    assert all(np.all(np.isfinite(np.asarray(leaf))) for leaf in jax.tree_util.tree_leaves(runner[0]))
    end = greedy(runner[0])
    assert start > best * 1.2 and end <= best * 1.05, (start, end, best)


def test_vmapped_greedy_evaluation_equals_single_runs():
    cfg = world("dl2").sim_config("testbed")
    traces = [TR.generate(TR.TraceConfig(num_jobs=6), seed=s) for s in range(3)]
    tc = T.TargetConfig(max_workers=cfg.max_workers, max_ps=cfg.max_ps, hidden=32)
    env, batch = X.from_traces(traces, cfg, 6, placement=False)
    net = T.init_params(tc, jax.random.PRNGKey(5))
    together = np.asarray(jax.vmap(X.jct)(P.evaluate(tc, env, net, batch, 300)))
    for i in range(3):
        one = jax.tree_util.tree_map(lambda a: a[None], X.unstack(batch, i))
        np.testing.assert_allclose(np.asarray(X.jct(X.unstack(P.evaluate(tc, env, net, one, 300), 0))),
                                   together[i], rtol=1e-6)


@pytest.mark.parametrize("world_name, cluster", [("dl2", "testbed"), ("today", "t4-16")])
def test_a_view_and_the_environment_give_the_policy_the_same_features(world_name, cluster):
    """One contract: the features the NumPy simulator's view gives the policy (what the daemon gives it too) are
    the ones training saw in the JAX environment, for the same state (a trace's first slots, both sides run
    with the same allocations, noise off), each job's measured speed among them (TargetConfig.speed_factor)."""
    from dl2d.sim import engine as E

    from dl2d.workload import philly

    cfg = world(world_name).sim_config(cluster, slot_noise=0.0)
    trace = (TR.generate(TR.TraceConfig(num_jobs=8), seed=3) if world_name == "dl2" else
             TR.from_workload(philly.generate(8, load=1.0, cluster_gpus=int(cfg.cluster.capacity[0]), seed=3), 60.0,
                              seed=3))
    slots = 3 if world_name == "dl2" else 1  # all-reduce speeds depend on placement, which the two sides do apart
    tc = T.TargetConfig(max_workers=min(cfg.max_workers, 16), max_ps=min(cfg.max_ps, 16), hidden=32,
                        speed_factor=True)
    net = T.init_params(tc, jax.random.PRNGKey(7))
    policy = TV.TargetPolicy(tc, net)
    env, state = X.from_trace(trace, cfg, len(trace), placement=False)
    checked = 0
    factor_col = T.feature_columns(tc).index(("speed_factor", 0))
    measured = []
    view_features = jax.jit(lambda o: T.job_features(tc, T.with_optimus(o)))  # compiled whole, not op by op
    env_features = jax.jit(lambda o: T.job_features(tc, o))

    def scheduler(view):
        nonlocal state, checked
        if checked < slots:
            obs = P.env_obs(tc, env, state)
            act = np.asarray(obs["active"])
            rows = np.flatnonzero(act)
            np.testing.assert_array_equal(np.asarray(view.job_ids), rows)
            mine = np.asarray(view_features(TV.padded(TV.view_obs(tc, view), len(view))))[:len(view)]
            theirs = np.asarray(env_features(obs))[rows]
            np.testing.assert_allclose(mine, theirs, rtol=2e-3, atol=2e-3)
            measured.append(np.count_nonzero(mine[:, factor_col]))
            checked += 1
        alloc = policy(view)
        full_w, full_p = np.zeros(len(trace), int), np.zeros(len(trace), int)
        full_w[np.asarray(view.job_ids)], full_p[np.asarray(view.job_ids)] = alloc.workers, alloc.ps
        state = X.step(env, state, full_w, full_p, noise=np.zeros(len(trace)))[0]
        if checked == slots:
            raise Checked  # the rest of the trace would only cost time
        return alloc

    with pytest.raises(Checked):
        E.run(trace, scheduler, cfg, seed=0)
    assert checked == slots
    # nothing is measured before a job has run a whole slot; in the DL2 world's third slot, jobs are
    assert measured[0] == 0 and (measured[-1] > 0) == (world_name == "dl2")


class Checked(Exception):
    """Every slot the test compares has been compared."""


# ------------------------------------------------------------------------------------------ the update's speed-ups

def random_batch(n=24, jobs=10, seed=0):
    """A flat PPO batch of ``n`` slots with random features, masks and targets (the keys ppo_loss reads)."""
    rng = np.random.default_rng(seed)
    active = rng.random((n, jobs)) < 0.4
    active[0, :] = True  # one slot with every job active
    allreduce = rng.random((n, jobs)) < 0.5
    x = np.where(active[..., None], rng.normal(size=(n, jobs, CFG.feature_dim)), 0.0).astype(np.float32)
    idx = np.where(allreduce, rng.integers(CFG.num_levels, size=(n, jobs)) * len(CFG.ps_levels),
                   rng.integers(CFG.num_actions, size=(n, jobs)))
    return {"x": jnp.asarray(x), "active": jnp.asarray(active), "allreduce": jnp.asarray(allreduce),
            "idx": jnp.asarray(idx, jnp.int32), "teacher": jnp.asarray(idx, jnp.int32),
            "logp": jnp.asarray(rng.normal(size=(n, jobs)) - 3, jnp.float32),
            "adv": jnp.asarray(np.where(active, rng.normal(size=(n, jobs)), 0.0), jnp.float32),
            "ret": jnp.asarray(rng.normal(size=(n, jobs)), jnp.float32), "done": jnp.zeros(n, bool)}


def test_the_batched_network_is_the_flax_module_slot_by_slot():
    b = random_batch()
    net = T.init_params(CFG, jax.random.PRNGKey(3))
    logits, values = T.apply(CFG, net, b["x"], b["active"], b["allreduce"])
    ref_logits, ref_values = jax.vmap(lambda x, a: T.TargetNet(CFG).apply({"params": net}, x, a))(b["x"], b["active"])
    open_ = ~(b["allreduce"][..., None] & (jnp.arange(CFG.num_actions) % len(CFG.ps_levels) > 0))
    np.testing.assert_allclose(np.where(open_, logits, 0), np.where(open_, ref_logits, 0), atol=1e-5)
    assert np.all(np.asarray(logits)[~np.asarray(open_)] == -1e9)
    np.testing.assert_allclose(values, ref_values, atol=1e-5)
    one_logits, _ = T.apply(CFG, net, b["x"][3], b["active"][3], b["allreduce"][3])  # one slot: the same
    np.testing.assert_allclose(one_logits, logits[3], atol=1e-5)


def test_the_packed_rows_are_every_active_job_of_each_minibatch_in_order():
    b = random_batch()
    pc = P.PPOConfig(epochs=2, minibatches=3)
    orders = np.asarray(P.epoch_orders(pc, jax.random.PRNGKey(0), 24))
    assert orders.shape == (2, 3, 8) and sorted(orders[1].ravel()) == list(range(24))  # each epoch a shuffle
    act = np.asarray(b["active"])
    plan = P.pack(act, orders)
    R = plan["valid"].shape[-1]
    most = max(int(act[orders[e, m]].sum()) for e in range(2) for m in range(3))
    assert R == P.row_bucket(most) and most <= R < 2 * most + 256
    for e in range(2):
        for m in range(3):
            want = [(s, j) for s in orders[e, m] for j in np.flatnonzero(act[s])]
            v = plan["valid"][e, m]
            assert list(zip(plan["row_slot"][e, m][v], plan["row_job"][e, m][v])) == want
            assert np.array_equal(orders[e, m][plan["slot"][e, m][v]], plan["row_slot"][e, m][v])
            assert np.all(plan["slot"][e, m][~v] == 8)  # padding pools nowhere
    assert [P.row_bucket(n) for n in (0, 1, 256, 257, 600, 1024, 1025)] == [256, 256, 256, 512, 1024, 1024, 2048]


def step_of(plan, m):
    """Minibatch ``m`` of a plan's first epoch."""
    return {k: v[0, m] for k, v in plan.items()}


@pytest.mark.parametrize("credit", ["job", "slot"])
def test_the_packed_minibatch_gives_the_dense_losses_and_gradients(credit):
    """The update reads the active jobs' rows only: the same losses and gradients as with every job's row."""
    b = random_batch()
    if credit == "slot":  # one advantage per slot
        b["adv"] = jnp.asarray(np.random.default_rng(1).normal(size=24), jnp.float32)
    b["learn"] = b["active"] & jnp.asarray(np.random.default_rng(2).random(b["active"].shape) < 0.8)
    pc = P.PPOConfig(credit=credit, ent_coef=0.01, epochs=1, minibatches=2)
    orders = P.epoch_orders(pc, jax.random.PRNGKey(5), 24)
    packed, dense = P.pack(b["active"], orders), P.dense_plan(orders, 10)
    assert packed["valid"].shape[-1] == 256 and dense["valid"].shape[-1] == 120
    net = T.init_params(CFG, jax.random.PRNGKey(4))
    for loss in (lambda n, mb: P.ppo_loss(CFG, pc, n, mb), lambda n, mb: P.sl_loss(CFG, pc, n, mb)):
        grad = jax.jit(jax.value_and_grad(loss, has_aux=True))  # compiled once a layout: eager is op by op
        for m in range(2):
            (full, _), g_full = grad(net, P.minibatch(b, step_of(dense, m)))
            (cut, _), g_cut = grad(net, P.minibatch(b, step_of(packed, m)))
            assert float(cut) == pytest.approx(float(full), rel=1e-5)
            for a, c in zip(jax.tree_util.tree_leaves(g_full), jax.tree_util.tree_leaves(g_cut)):
                np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-6)
    # the whole update: packed on the host, or every row from the key
    key = jax.random.PRNGKey(5)
    opt = P.make_optimizer(pc).init(net)
    net_d, _, st_d = P.update(CFG, pc, net, opt, b, key=key)
    net_p, _, st_p = P.update(CFG, pc, net, opt, b, plan=P.pack(b["active"], P.epoch_orders(pc, key, 24)))
    assert float(st_p["loss"]) == pytest.approx(float(st_d["loss"]), rel=1e-5)
    for a, c in zip(jax.tree_util.tree_leaves(net_d), jax.tree_util.tree_leaves(net_p)):
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-6)


def test_packed_rows_through_the_network_are_the_dense_slots():
    b = random_batch()
    net = T.init_params(CFG, jax.random.PRNGKey(3))
    logits, values = T.apply(CFG, net, b["x"], b["active"], b["allreduce"])
    act = np.asarray(b["active"])
    s, j = np.nonzero(act)
    pad = 7  # padding rows: inactive, pooled nowhere
    slot = np.concatenate([s, np.full(pad, 24)])
    rows = lambda v: jnp.concatenate([v[s, j], jnp.zeros((pad, *v.shape[2:]), v.dtype)])
    lr, vr = T.apply_rows(CFG, net, rows(b["x"]), rows(b["active"]), rows(b["allreduce"]), jnp.asarray(slot), 24)
    np.testing.assert_allclose(lr[: len(s)], np.asarray(logits)[s, j], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(vr[: len(s)], np.asarray(values)[s, j], rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(vr[len(s):]) == 0)


def test_sampling_draws_the_softmax_and_never_a_closed_pair():
    probs = np.array([0.1, 0.0, 0.6, 0.3])
    logits = jnp.asarray(np.where(probs > 0, np.log(np.maximum(probs, 1e-30)), -1e9), jnp.float32)
    draws = np.asarray(T.sample(jax.random.PRNGKey(0), jnp.broadcast_to(logits, (100_000, 4))))
    freq = np.bincount(draws, minlength=4) / len(draws)
    assert freq[1] == 0.0
    np.testing.assert_allclose(freq, probs, atol=0.005)  # 5 standard deviations of the largest at n = 1e5


@pytest.mark.parametrize("credit", ["job", "slot"])
def test_the_ppo_loss_is_the_clipped_objective_value_and_entropy_computed_by_hand(credit):
    """The loss's value against the formula computed apart in NumPy from the network's own outputs: the
    clipped surrogate (the smaller of the plain and the clipped ratio times the advantage), half the squared
    value error, and the entropy bonus subtracted. The batch has ratios beyond both clip bounds with either
    sign of advantage, so a clip taken the wrong way, or an entropy added, changes the value."""
    b = random_batch()
    if credit == "slot":
        b["adv"] = jnp.asarray(np.random.default_rng(1).normal(size=24), jnp.float32)
    b["learn"] = b["active"] & jnp.asarray(np.random.default_rng(2).random(b["active"].shape) < 0.8)
    pc = P.PPOConfig(credit=credit, ent_coef=0.05, vf_coef=0.5, clip=0.2, temperature=0.7, epochs=1, minibatches=1)
    mb = P.minibatch(b, step_of(P.dense_plan(P.epoch_orders(pc, jax.random.PRNGKey(5), 24), 10), 0))
    net = T.init_params(CFG, jax.random.PRNGKey(4))
    loss, aux = P.ppo_loss(CFG, pc, net, mb)

    logits, values = (np.asarray(a, np.float64) for a in P._forward(CFG, net, mb))
    z = logits / pc.temperature
    log_pi = z - z.max(-1, keepdims=True)
    log_pi -= np.log(np.exp(log_pi).sum(-1, keepdims=True))
    act, learn = np.asarray(mb["active"]), np.asarray(mb["learn"])
    slot, n_slots = np.asarray(mb["slot"]), mb["slots"].shape[0]
    logp = log_pi[np.arange(len(log_pi)), np.asarray(mb["idx"])]
    old, adv = np.asarray(mb["logp"], np.float64), np.asarray(mb["adv"], np.float64)

    def per_slot(x):
        out = np.zeros(n_slots + 1)
        np.add.at(out, slot, x)
        return out[:n_slots]

    if credit == "job":
        ratio, mask = np.exp(logp - old), learn
    else:
        ratio = np.exp(per_slot(np.where(act, logp, 0)) - per_slot(np.where(act, old, 0)))
        mask = np.ones(n_slots, bool)
    lo, hi = ratio * adv, np.clip(ratio, 1 - pc.clip, 1 + pc.clip) * adv
    assert np.any(mask & (lo < hi - 1e-3)) and np.any(mask & (hi < lo - 1e-3))  # the clip bites both ways
    pg = -np.minimum(lo, hi)[mask].mean()
    vf = 0.5 * ((values - np.asarray(mb["ret"]))[act] ** 2).mean()
    h = -(np.exp(log_pi) * log_pi).sum(-1)
    ent = np.mean(per_slot(np.where(learn, h, 0)) / np.maximum(per_slot(learn.astype(float)), 1))
    assert float(aux["pg"]) == pytest.approx(pg, rel=1e-4, abs=1e-6)
    assert float(aux["vf"]) == pytest.approx(vf, rel=1e-4)
    assert float(aux["entropy"]) == pytest.approx(ent, rel=1e-4) and ent > 0.1
    assert float(loss) == pytest.approx(pg + pc.vf_coef * vf - pc.ent_coef * ent, rel=1e-4, abs=1e-6)
