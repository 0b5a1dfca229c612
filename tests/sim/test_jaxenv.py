"""The JAX environment (dl2d.sim.jaxenv) against the NumPy engine, its reference: the same traces and the same
placed allocations (recorded from a registry heuristic driving the engine, then replayed) give the same
progress every slot and the same JCTs, with the slot noise off and on (the engine's own draws passed in);
vmapped clusters agree with single ones, and a scan with a Python loop of jitted steps.

JAX computes in float32 here (the engine in float64), so "the same" is to float32 rounding accumulated over
hundreds of slots: relative 1e-4 on epochs, 1e-5 (at least 1e-3 slot) on JCTs. In float64 (`jax.enable_x64`)
the two agree to 1e-9."""
from __future__ import annotations

from dataclasses import replace

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dl2d.core.contract import Allocation
from dl2d.policy import registry
from dl2d.sim import allreduce
from dl2d.sim import engine as E
from dl2d.sim import jaxenv as X
from dl2d.sim import trace as T
from dl2d.sim.cluster import T4_NODE, ClusterSpec
from dl2d.sim.worlds import world
from dl2d.workload import batching, catalog, philly, throughput
from dl2d.workload.speedfit import SiteSpeeds, parse_speed_model
from dl2d.workload.workloads import WorkloadJob

J = 16  # every trace here has 12 jobs: 4 rows of padding
SLOTS = 640  # every recorded run is padded to this many slots (one compiled scan per kind of environment)
NODES = ClusterSpec(4, **T4_NODE)
WIDE = ClusterSpec(2, gpus=8.0, cpus=96.0, mem_gb=384.0)  # 8-GPU nodes: placements never measured, the fit

def short(tr: T.Trace, epochs: float) -> T.Trace:
    return replace(tr, est_epochs=np.minimum(tr.est_epochs, epochs), true_epochs=np.minimum(tr.true_epochs, epochs))


def dl2_trace(seed: int) -> T.Trace:
    tr = T.generate(T.TraceConfig(num_jobs=12, max_arrivals_per_slot=4, arrival_pattern="uniform",
                                  epoch_estimate_error=0.2), seed=seed)
    return short(tr, 30.0)


def today_trace(seed: int) -> T.Trace:
    wl = philly.generate(12, load=2.0, cluster_gpus=16, seed=seed, max_gpus=16)
    return short(T.from_workload(wl, 60.0, seed=seed, epoch_estimate_error=0.1), 3.0)


def mixed_trace(seed: int) -> T.Trace:
    """Six PS jobs of DL2 and six all-reduce jobs in one trace, by arrival."""
    a = T.generate(T.TraceConfig(num_jobs=6, max_arrivals_per_slot=2, arrival_pattern="uniform"), seed=seed)
    b = today_trace(seed)
    a, b = short(a, 20.0), b
    take = lambda tr, k: np.asarray(getattr(tr, k))[:6]  # noqa: E731
    cols = {k: np.concatenate([take(a, k), take(b, k)]) for k in
            ("arrival_slot", "type_idx", "est_epochs", "true_epochs", "speed_factor", "batch_size", "requested")}
    order = np.argsort(cols["arrival_slot"], kind="stable")
    return T.Trace(**{k: v[order] for k, v in cols.items()})


def adaptive_trace(seed: int) -> T.Trace:
    """A Philly workload whose every job lets the scheduler choose its batch (all of measured models)."""
    wl = philly.generate(12, load=2.0, cluster_gpus=16, seed=seed, max_gpus=16)
    return short(T.from_workload(wl, 60.0, seed=seed, epoch_estimate_error=0.1, adaptive=True), 3.0)


#: A site's speed model (dl2ctl calibrate's file) with its job mix: cifar10 at its own curve, and "my-llm", a
#: class the catalog does not hold, whose speed only this file gives
SITE = SiteSpeeds.of(parse_speed_model(json.dumps({"format": "dl2d-speed-model", "version": 1, "classes": {
    "cifar10": {"seconds_per_epoch": [40.0 / g ** 0.9 for g in range(1, 17)], "jobs": 3, "epochs": 2.0,
                "spread": {"slowdown": 0.5}},
    "my-llm": {"seconds_per_epoch": [300.0 / g ** 0.7 for g in range(1, 9)], "jobs": 2, "epochs": 1.5}}})), "test")


def site_trace(seed: int) -> T.Trace:
    """A Philly workload of a site's own mix: jobs of cifar10 and of its class my-llm (site:my-llm)."""
    wl = philly.generate(12, load=2.0, cluster_gpus=16, seed=seed, max_gpus=16)
    return T.from_workload(wl, 60.0, seed=seed, epoch_estimate_error=0.1, site_mix=SITE.mix)


DL2 = world("dl2").sim_config("tiny")
# DL2's spread placement: jobs share servers and move at the same size, the effects the match must cover
TODAY = replace(world("today").sim_config(), cluster=NODES, allreduce_placement="spread")
CASES = {  # name: (trace, engine config, policy)
    "dl2-drf": (dl2_trace(1), DL2, "drf"),
    "dl2-optimus-long-restarts": (dl2_trace(2), replace(DL2, resize_overhead_s=1500.0), "optimus"),
    "today-drf": (today_trace(5), TODAY, "drf"),
    "today-elastic": (today_trace(6), TODAY, "elastic"),
    "mixed-drf": (mixed_trace(10), replace(TODAY, cluster=WIDE), "drf"),
    "site-elastic": (site_trace(4), replace(TODAY, site_speeds=SITE), "elastic"),
    "today-elastic-pack": (today_trace(6), replace(TODAY, allreduce_placement="pack"), "elastic"),
    # every job's batch the scheduler's: each (re)start at the goodput-optimal batch for its GPUs
    "adaptive-elastic-goodput": (adaptive_trace(6), TODAY, "elastic+goodput"),
}


class RecordingRng:
    """The engine's generator, keeping every draw (the engine draws the slot noise with one `uniform` call per
    slot, one value per active job by arrival)."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.draws: list[np.ndarray] = []

    def uniform(self, *args, **kw):
        x = self.rng.uniform(*args, **kw)
        self.draws.append(x)
        return x


def engine_run(tr: T.Trace, cfg: E.SimConfig, policy: str, seed: int = 0) -> dict:
    """The engine's run loop, recording per slot what was placed (counts, workers per server), the noise drawn
    and the progress, padded to J jobs and SLOTS slots."""
    name, _, batch = policy.partition("+")
    pol = registry.build(name, registry.PolicyOptions(batch=batch or "fixed"))
    rng = RecordingRng(seed)
    state = replace(E.SimState.initial(len(tr)), slot=int(tr.arrival_slot.min()))
    S = cfg.cluster.num_servers
    out = {k: np.zeros((SLOTS, J)) for k in ("noise", "epochs")}
    out["factor"] = np.full((SLOTS, J), np.nan)  # the measured job_speed_factor after each slot
    out.update(workers=np.zeros((SLOTS, J), np.int32), ps=np.zeros((SLOTS, J), np.int32),
               placement=np.zeros((SLOTS, J, S), np.int32), reward=np.zeros(SLOTS), resized=np.zeros(SLOTS, int),
               batch=np.zeros((SLOTS, J)))
    t = shared = moved = unmeasured = 0
    while not state.done():
        view = E.view_of(tr, state, cfg)
        alloc = pol(view) if len(view) else Allocation(np.zeros(0, int), np.zeros(0, int))
        prev = [state.worker_servers[i] for i in view.job_ids]
        state, reward, info = E.step(tr, state, alloc, cfg, rng)
        jobs = info["jobs"]
        assert len(rng.draws) == t + 1
        out["workers"][t, jobs], out["ps"][t, jobs], out["noise"][t, jobs] = info["workers"], info["ps"], rng.draws[-1]
        for k, i in enumerate(jobs):
            np.add.at(out["placement"][t, i], np.asarray(info["worker_servers"][k], int), 1)
        ar = [k for k in range(len(jobs)) if tr.allreduce[jobs[k]]]
        for k in ar:
            if info["worker_servers"][k] and tr.type_idx[jobs[k]] != catalog.UNSEEN:
                model = catalog.MODEL_NAMES[tr.type_idx[jobs[k]]]
                pl = allreduce.gpu_placement(info["worker_servers"][k], 1.0)
                unmeasured += pl not in throughput.throughput_model(model).points
        if ar:
            shared += int(allreduce.shares_a_server([info["worker_servers"][k] for k in ar]).sum())
            moved += sum(bool(allreduce.moved([prev[k]], [info["worker_servers"][k]])[0])
                         and info["workers"][k] == len(prev[k]) > 0 for k in ar)
        out["batch"][t, :len(tr)] = E.batches(tr, state)  # what each job trained at (0 past the trace: kept)
        out["epochs"][t, :len(tr)] = state.epochs_done
        out["factor"][t, :len(tr)] = E.measured_speed_factor(state.speed_factors)
        out["reward"][t], out["resized"][t] = reward, info["resized"]
        t += 1
    assert t <= SLOTS
    out["epochs"][t:] = out["epochs"][t - 1]
    out["factor"][t:] = out["factor"][t - 1]
    out.update(slots=t, jct=state.finish_time - tr.submitted, shared=shared, moved=moved, unmeasured=unmeasured)
    return out


_RUNS: dict = {}


def recorded(case: str, noise: float, seed: int) -> dict:
    """`engine_run` of a case, once per test session."""
    if (case, noise, seed) not in _RUNS:
        tr, cfg, policy = CASES[case]
        _RUNS[case, noise, seed] = engine_run(tr, replace(cfg, slot_noise=noise), policy, seed)
    return _RUNS[case, noise, seed]


def test_the_recorded_runs_exercise_what_depends_on_placement():
    """Multi-server all-reduce jobs sharing a server (the slowdown), a job moved at the same size (a restart),
    placements measured and not (Pollux's fit), a restart longer than a slot (whole slots without training)."""
    runs = [recorded(c, 0.1, 7) for c in ("today-drf", "today-elastic", "mixed-drf")]
    assert all(r["shared"] > 0 and r["moved"] > 0 for r in runs) and runs[2]["unmeasured"] > 50
    rec = recorded("dl2-optimus-long-restarts", 0.1, 7)
    assert (np.diff(rec["epochs"][:rec["slots"]], axis=0) == 0).all(axis=1).any()


def test_jobs_adapting_their_batch_are_given_new_batches_and_the_replay_needs_them():
    """The recorded goodput run gives most jobs a batch other than the one submitted, and some at a local batch
    beyond their measured ones (the fit through the edge); replayed with the batches held as submitted, the JAX
    environment parts from the engine by whole epochs: the batch input is what the match rests on."""
    tr, cfg, _ = CASES["adaptive-elastic-goodput"]
    rec = recorded("adaptive-elastic-goodput", 0.1, 7)
    n, t = len(tr), rec["slots"]
    given = rec["batch"][:t, :n]
    assert (given != tr.batch_size).any(axis=0).sum() >= 8 and (np.diff(given, axis=0) != 0).sum() >= 5
    params, state = X.from_trace(tr, replace(cfg, slot_noise=0.1), J)
    assert params.adaptive
    _, traj = _replay(params, state, rec["workers"], rec["ps"], rec["placement"], rec["noise"], None)
    assert np.abs(np.asarray(traj["epochs_done"])[:, :n] - rec["epochs"][:, :n]).max() > 1.0


def test_a_job_speed_at_any_batch_and_placement_is_the_engines_lookup():
    """In float64, an adaptive job's epochs/s at every batch its model may take (the measured local batches
    exactly, between them, below and above them) on measured placements and off-table ones (Pollux's fit) equal
    dl2d.workload.catalog.allreduce_epoch_rate's to 1e-9, for every all-reduce model."""
    cases = []  # (model, placement, batch)
    for model in catalog.ALLREDUCE_MODELS:
        lim = batching.limits(model)
        pts = throughput.throughput_model(model).points
        for p in [p for p in pts if len(p) <= 4 and max(p) <= 4][::3] + [(5,), (8, 8), (6, 2, 1)]:
            exact = [x * sum(p) for x in pts[p][0]] if p in pts else []
            cases += [(model, p, float(b)) for b in [*np.geomspace(lim.init, lim.max_total, 7), *exact]
                      if lim.init <= b <= lim.max_total]
    assert {m for m, p, _ in cases if p not in throughput.throughput_model(m).points} == set(catalog.ALLREDUCE_MODELS)
    n = len(cases)
    ones = np.ones(n)
    tr = T.Trace(arrival_slot=np.zeros(n, int), type_idx=np.array([catalog.MODEL_NAMES.index(m) for m, _, _ in cases]),
                 est_epochs=ones, true_epochs=ones, speed_factor=ones,
                 batch_size=np.array([float(batching.limits(m).init) for m, _, _ in cases]), adaptive=np.ones(n, bool))
    cluster = ClusterSpec(4, gpus=8.0, cpus=96.0, mem_gb=384.0)  # room for placements never measured
    with jax.enable_x64(True):
        params, state = X.from_trace(tr, replace(world("today").sim_config(), cluster=cluster), n)
        counts = np.zeros((n, cluster.num_servers), np.int32)
        for k, (_, p, _) in enumerate(cases):
            counts[k, :len(p)] = p
        got = np.asarray(X._allreduce_rates(params, state.jobs, jnp.asarray(counts.sum(axis=1)), jnp.asarray(counts),
                                            jnp.asarray([b for _, _, b in cases]))[0])
    want = [catalog.allreduce_epoch_rate(m, b, throughput.canonical(p)) for m, p, b in cases]
    np.testing.assert_allclose(got, want, rtol=1e-9)


@jax.jit
def _replay(params, state, workers, ps, placement, noise, batch):
    return X.replay(params, state, workers, ps, placement, noise, batch)


def jax_replay(tr: T.Trace, cfg: E.SimConfig, rec: dict):
    params, state = X.from_trace(tr, cfg, J)
    placement = rec["placement"] if params.placement else None
    batch = rec["batch"] if params.adaptive else None
    return params, _replay(params, state, rec["workers"], rec["ps"], placement, rec["noise"], batch)


@pytest.mark.parametrize("noise", [0.0, 0.1], ids=["noise-off", "noise-on"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_jax_environment_matches_the_engine_slot_for_slot(case, noise):
    tr, cfg, policy = CASES[case]
    cfg = replace(cfg, slot_noise=noise)
    rec = recorded(case, noise, seed=7)
    params, (final, traj) = jax_replay(tr, cfg, rec)
    n, t = len(tr), rec["slots"]
    np.testing.assert_allclose(np.asarray(traj["epochs_done"])[:, :n], rec["epochs"][:, :n], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(traj["reward"])[:t], rec["reward"][:t], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(traj["resized"])[:t], rec["resized"][:t])
    # each job's measured speed (the daemon's job_speed_factor) after every slot, unmeasured (NaN) alike
    np.testing.assert_allclose(np.asarray(traj["job_speed_factor"])[:, :n], rec["factor"][:, :n], rtol=1e-4,
                               atol=1e-5)
    assert np.isfinite(rec["factor"][:t, :n]).any(axis=0).sum() >= 3  # jobs measured: not NaN against NaN
    np.testing.assert_allclose(np.asarray(X.jct(final))[:n], rec["jct"], rtol=1e-5, atol=1e-3)
    done = np.asarray(traj["done"])
    assert done[t - 1] and not done[:t - 1].any()  # done in the same slot as the engine
    assert int(final.slot) == int(tr.arrival_slot.min()) + t and np.isnan(np.asarray(X.jct(final))[n:]).all()
    assert params.placement == bool(tr.allreduce.any())


@pytest.mark.parametrize("case", ["today-drf", "mixed-drf", "dl2-optimus-long-restarts"])
def test_in_float64_the_match_is_to_rounding(case):
    tr, cfg, policy = CASES[case]
    cfg = replace(cfg, slot_noise=0.1)
    rec = recorded(case, 0.1, 7)
    with jax.enable_x64(True):
        _, (final, traj) = jax_replay(tr, cfg, rec)
        assert final.epochs_done.dtype == jnp.float64
        n = len(tr)
        np.testing.assert_allclose(np.asarray(traj["epochs_done"])[:, :n], rec["epochs"][:, :n], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(np.asarray(X.jct(final))[:n], rec["jct"], rtol=1e-9, atol=1e-9)


def test_without_placement_an_allreduce_job_trains_packed_on_the_fewest_servers():
    """placement=False: the engine's speed of the packed placement (catalog.packed), measured or fitted."""
    wl = [WorkloadJob("j", 0.0, "cifar10", 1, 512.0)]
    tr = T.from_workload(wl, 60.0, interference_sigma=0.0)
    cfg = replace(TODAY, slot_noise=0.0, resize_overhead_s=0.0)
    params, state = X.from_trace(tr, cfg, J, placement=False)
    assert not params.placement and params.has_allreduce and state.servers.shape == (J, 0)
    step = jax.jit(X.step)
    for gpus in (1, 2, 3, 4, 5, 8, 11, 16, 17, 23, 64):  # 17 and up: 5+ nodes, not all measured
        w = np.zeros(J, np.int32)
        w[0] = gpus
        nxt, _, _, _ = step(params, state, w, np.zeros(J, np.int32))
        rate = catalog.allreduce_epoch_rate("cifar10", 512.0, catalog.packed(gpus, 4))
        assert float(nxt.epochs_done[0]) == pytest.approx(rate * 60.0, rel=1e-5)


def fair_share_batch(traces, cfg, slots):
    """(params, batch of states, rollout, its vmapped and single jitted forms) of the fair-share rule over ``traces``."""
    params, batch = X.from_traces(traces, cfg, J, seeds=[11, 12, 13, 14])
    run = lambda p, s: X.rollout(p, s, X.fair_share, slots, autoreset=False)  # noqa: E731
    return params, batch, run, jax.jit(jax.vmap(run, in_axes=(None, 0))), jax.jit(run)


@pytest.mark.parametrize("kind", ["dl2", "today"])
def test_a_vmapped_batch_of_clusters_equals_single_runs(kind):
    if kind == "dl2":
        traces, cfg = [dl2_trace(s) for s in (1, 2, 3, 4)], DL2
    else:
        traces, cfg = [today_trace(s) for s in (3, 4, 5, 6)], TODAY
    params, batch, run, many, one = fair_share_batch(traces, cfg, 96)
    final, traj = many(params, batch)
    progressed = 0
    for i in range(len(traces)):
        f1, t1 = one(params, X.unstack(batch, i))
        for a, b in zip(jax.tree_util.tree_leaves((f1, t1)), jax.tree_util.tree_leaves(X.unstack((final, traj), i))):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-6)
        progressed += float(f1.epochs_done.sum()) > 0
    assert progressed == len(traces)
    # batched params as well: each cluster its own slot length and noise
    stacked = X.stack([params.replace(slot_seconds=params.slot_seconds * (1 + i), slot_noise=params.slot_noise * i)
                       for i in range(len(traces))])
    final_p, traj_p = jax.jit(jax.vmap(run))(stacked, batch)
    for i in range(len(traces)):
        fi, ti = one(X.unstack(stacked, i), X.unstack(batch, i))
        np.testing.assert_allclose(np.asarray(fi.epochs_done), np.asarray(final_p.epochs_done[i]), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(ti["reward"]), np.asarray(traj_p["reward"][i]), rtol=1e-6, atol=1e-7)
    assert not np.allclose(np.asarray(traj_p["reward"]), np.asarray(traj["reward"]))  # the params did differ


def test_a_scan_over_slots_equals_a_python_loop_of_jitted_steps():
    tr, cfg, policy = CASES["today-elastic"]
    cfg = replace(cfg, slot_noise=0.1)
    rec = engine_run(tr, cfg, policy, seed=3)
    params, (final, traj) = jax_replay(tr, cfg, rec)
    _, state = X.from_trace(tr, cfg, J)
    step = jax.jit(X.step)
    for t in range(rec["slots"]):
        state, reward, done, _ = step(params, state, rec["workers"][t], rec["ps"][t], rec["placement"][t],
                                      rec["noise"][t])
        np.testing.assert_allclose(np.asarray(state.epochs_done), np.asarray(traj["epochs_done"][t]), rtol=1e-6)
        assert float(reward) == pytest.approx(float(traj["reward"][t]), rel=1e-6, abs=1e-7)
    assert bool(done)
    np.testing.assert_allclose(np.asarray(X.jct(state)), np.asarray(X.jct(final)), rtol=1e-6)


def test_own_noise_is_drawn_from_the_key_and_a_finished_cluster_starts_over_with_autoreset():
    tr = dl2_trace(1)
    cfg = replace(DL2, slot_noise=0.1)
    params, state = X.from_trace(tr, cfg, J, seed=0)
    rule = lambda s: X.fair_share(params, s)  # noqa: E731
    step = jax.jit(X.step)
    w, p, _ = rule(state)
    a, _, _, _ = step(params, state, w, p)
    b, _, _, _ = step(params, state.replace(key=jax.random.PRNGKey(1)), w, p)
    assert not np.allclose(np.asarray(a.epochs_done), np.asarray(b.epochs_done))  # other draws, other progress
    c, _, _, _ = step(params, state, w, p)
    np.testing.assert_array_equal(np.asarray(a.epochs_done), np.asarray(c.epochs_done))  # pure
    final, traj = jax.jit(lambda s: X.rollout(params, s, X.fair_share, 400))(state)
    done = np.asarray(traj["done"])
    assert done.sum() >= 1
    first = int(np.argmax(done))
    assert np.isfinite(traj["episode_jct"][first]) and np.isnan(np.asarray(traj["episode_jct"])[~done]).all()
    # the same episode stepped without auto-reset ends with that average JCT
    ended, _ = jax.jit(lambda s: X.rollout(params, s, X.fair_share, first + 1, autoreset=False))(state)
    assert float(jnp.nanmean(X.jct(ended))) == pytest.approx(float(traj["episode_jct"][first]), rel=1e-6)
    assert bool(X.is_done(ended))


def test_counts_beyond_the_limits_are_clipped_and_overflow_is_reported():
    tr = dl2_trace(1)
    params, state = X.from_trace(tr, DL2, J)
    obs = X.observe(params, state)
    act = np.asarray(obs["active"])
    assert act.sum() == 4 and "true_epochs" not in obs and "speed_factor" not in obs
    w = np.where(act, 99, 0)
    nxt, _, _, info = jax.jit(X.step)(params, state, w, w)
    assert int(info["clipped"]) == 4 and bool(info["over_capacity"])
    assert (np.asarray(info["workers"])[act] == DL2.max_workers).all()
    assert np.asarray(nxt.workers)[~act].sum() == 0


def test_a_batch_a_job_does_not_allow_is_not_applied_and_is_counted():
    """Only an adaptive job takes a new batch, and only within its model's measured batches (the engine refuses
    the rest with a ValueError; inside a compiled step they are held and counted in ``info["clipped"]``); a new
    batch at the same GPUs is a restart; an environment without adaptive jobs takes no batch at all."""
    tr = adaptive_trace(6)
    zero = np.zeros(len(tr))  # all there at once; odd rows adapt
    tr = replace(tr, adaptive=np.arange(len(tr)) % 2 == 1, arrival_slot=zero.astype(int), submitted=zero)
    params, state = X.from_trace(tr, replace(TODAY, slot_noise=0.0), J, placement=False)
    act = np.asarray(X.observe(params, state)["active"])
    rows = np.flatnonzero(act)
    assert len(rows) >= 2 and {0, 1} <= set(rows % 2)
    lim = np.array([batching.limits(catalog.MODEL_NAMES[t]).max_total for t in tr.type_idx])
    w = jnp.asarray(np.where(act, 1, 0))
    s1, _, _, _ = jax.jit(X.step)(params, state, w, w * 0)
    want = np.zeros(J)
    want[rows] = 2 * tr.batch_size[rows]  # inside every model's limits
    s2, _, _, info = jax.jit(X.step)(params, s1, w, w * 0, None, None, jnp.asarray(want))
    got = np.asarray(s2.batch)
    odd, even = rows[rows % 2 == 1], rows[rows % 2 == 0]
    assert (got[odd] == want[odd]).all() and (got[even] == tr.batch_size[even]).all()
    assert int(info["clipped"]) == len(even) and int(info["resized"]) == len(odd)
    too_big = np.zeros(J)
    too_big[rows] = 10 * lim[rows]
    s3, _, _, info = jax.jit(X.step)(params, s2, w, w * 0, None, None, jnp.asarray(too_big))
    assert (np.asarray(s3.batch)[odd] == lim[odd]).all() and int(info["clipped"]) == len(rows)
    fixed, st = X.from_trace(today_trace(6), TODAY, J, placement=False)
    assert not fixed.adaptive
    with pytest.raises(ValueError, match="no job that adapts its batch"):
        X.step(fixed, st, w, w * 0, None, None, jnp.asarray(want))


def test_what_the_environment_does_not_model_is_refused():
    tr = dl2_trace(1)
    with pytest.raises(ValueError, match="does not fit max_jobs"):
        X.from_trace(tr, DL2, 8)
    with pytest.raises(ValueError, match="cross-node"):
        X.from_trace(tr, replace(DL2, cross_node_comm=True), J)
    params, state = X.from_trace(today_trace(3), TODAY, J)
    with pytest.raises(ValueError, match="placement"):
        X.step(params, state, jnp.zeros(J, jnp.int32), jnp.zeros(J, jnp.int32))
