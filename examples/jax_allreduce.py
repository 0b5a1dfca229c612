"""A data-parallel JAX/Flax training job that dl2d can start at any size and resize by checkpoint-restart
(docs/jobs.md, "JAX recipe").

Each process holds the whole model (replicated) and its slice of every global batch; XLA all-reduces the
gradients (on CPU over gloo, so it runs without a GPU). The batch of global step ``s`` is drawn from a
generator keyed on ``(seed, s)`` and split evenly over the processes, so the parameters after step ``s`` do not
depend on how many processes computed them or how often the job was resized. Checkpoints are orbax's, saved by
all processes together and restored onto whatever number of processes the next run has.

An adaptive job (submitted with ``--adaptive-batch``) trains at the batch dl2d gives each run (``DL2D_BATCH_SIZE``),
reports its gradient noise and scales its learning rate by AdaScale's gain (``--lr-rule``).

    srun -n 3 python examples/jax_allreduce.py --steps 200          # under dl2d: the batch script does this
    python examples/jax_allreduce.py --steps 200 --checkpoint-dir /tmp/ck   # by hand, one process
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import dl2d.job
from dl2d.job.batch import LR_RULES, GradientNoise, lr_scale


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200, help="global steps to train in all")
    p.add_argument("--global-batch", type=int, default=12, help="samples per global step (all processes)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--checkpoint-every", type=int, default=50, help="also save every N steps (0: only on the "
                   "checkpoint signal and at the end)")
    p.add_argument("--checkpoint-dir", default=None, help="where to keep checkpoints when dl2d does not say")
    p.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step (makes a tiny model as slow "
                   "as a real one, for tests)")
    p.add_argument("--step-log", type=Path, default=None, help="rank 0 appends 'processes step' per step done "
                   "here")
    p.add_argument("--params-out", type=Path, default=None, help="at the end, rank 0 writes the parameters here "
                   "(.npz)")
    p.add_argument("--ignore-signal", action="store_true", help="break the contract: never save on the signal "
                   "(for tests of what dl2d does then)")
    p.add_argument("--max-local-batch", type=int, default=512, help="an adaptive job (DL2D_BATCH_SIZE set): the "
                   "most samples a process takes in a pass, unless dl2d says (DL2D_MAX_LOCAL_BATCH)")
    p.add_argument("--lr-rule", choices=LR_RULES, default="adascale", help="an adaptive job: how the learning rate "
                   "follows the batch (dl2d.job.batch.lr_scale)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = dl2d.job.start(total_steps=args.steps, checkpoint_dir=args.checkpoint_dir)
    c = run.contract
    # An adaptive job trains at the batch dl2d gives this run, split over its processes in passes of at most
    # max_local_batch (one pass each here: the local batch is small); its gradient noise is measured between the
    # passes' gradients, its learning rate scaled from the one tuned for its submitted batch.
    adaptive = c.batch_size is not None
    passes = 1
    if adaptive:
        plan = run.batch_plan(args.global_batch, args.max_local_batch)
        args.global_batch, passes = plan.total, plan.accumulation_steps + 1
        noise = GradientNoise(init_batch=c.initial_batch_size or args.global_batch)
    if args.global_batch % c.world_size:
        print(f"global batch {args.global_batch} does not split over {c.world_size} processes", file=sys.stderr)
        return 2

    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    if c.world_size > 1:
        jax.distributed.initialize(coordinator_address=c.coordinator, num_processes=c.world_size,
                                   process_id=c.rank)
    import flax.linen as nn
    import jax.numpy as jnp
    import numpy as np
    import optax
    import orbax.checkpoint as ocp
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("data",))
    replicated, by_process = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    local = args.global_batch // c.world_size
    # the gradients compared for the noise: one a pass of each process (two halves of a pass on one process)
    n_grads = (c.world_size * passes if c.world_size * passes > 1 else 2) if adaptive else 1

    # The data: a fixed synthetic regression set, the same on every process.
    data_rng = np.random.default_rng(args.seed)
    xs = data_rng.normal(size=(4096, 16)).astype(np.float32)
    ys = np.sin(xs @ data_rng.normal(scale=0.25, size=(16, 1)).astype(np.float32))

    def batch_of(step: int) -> tuple[np.ndarray, np.ndarray]:
        """This process's slice of global step ``step``'s batch (keyed on the step, not on the run)."""
        idx = np.random.default_rng([args.seed, step]).choice(len(xs), args.global_batch, replace=False)
        mine = idx[c.rank * local:(c.rank + 1) * local]
        return xs[mine], ys[mine]

    class MLP(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.tanh(nn.Dense(64)(x))
            x = nn.tanh(nn.Dense(64)(x))
            return nn.Dense(1)(x)

    model, tx = MLP(), optax.sgd(args.lr, momentum=0.9)

    def init_state():
        params = model.init(jax.random.key(args.seed), jnp.zeros((1, 16)))
        return {"params": params, "opt": tx.init(params)}

    state = jax.jit(init_state, out_shardings=replicated)()

    def train_step(state, x, y, stop, scale):
        def loss_fn(params, x, y):
            return jnp.mean((model.apply(params, x) - y) ** 2)
        # the batch in n_grads equal parts (1 for a fixed batch): their mean loss and gradient are the batch's
        xs, ys = x.reshape(n_grads, -1, x.shape[-1]), y.reshape(n_grads, -1, y.shape[-1])
        losses, each = jax.vmap(jax.value_and_grad(loss_fn), in_axes=(None, 0, 0))(state["params"], xs, ys)
        grads = jax.tree.map(lambda g: g.mean(0), each)
        sqr_each = sum(jnp.sum(g.reshape(n_grads, -1) ** 2, axis=1) for g in jax.tree.leaves(each))
        sqr_mean = sum(jnp.sum(g ** 2) for g in jax.tree.leaves(grads))
        updates, opt = tx.update(grads, state["opt"], state["params"])
        updates = jax.tree.map(lambda u: u * scale, updates)  # the learning rate's factor for this batch
        # stop: one flag per process; its max is every process's answer to "was any of us signalled?"
        return ({"params": optax.apply_updates(state["params"], updates), "opt": opt}, losses.mean(), stop.max(),
                sqr_each, sqr_mean)

    step_fn = jax.jit(train_step, in_shardings=(replicated, by_process, by_process, by_process, replicated),
                      out_shardings=(replicated,) * 5)  # no donation: a stop keeps the old state

    def global_array(local_rows: np.ndarray) -> jax.Array:
        return jax.make_array_from_process_local_data(by_process, local_rows)

    manager = ocp.CheckpointManager(
        Path(c.checkpoint_dir).absolute() / "orbax",
        options=ocp.CheckpointManagerOptions(max_to_keep=2, enable_async_checkpointing=False))
    step = manager.latest_step() or 0  # orbax lists only checkpoints it finished writing
    if step:
        abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated), state)
        state = manager.restore(step, args=ocp.args.StandardRestore(abstract))
    run.resumed(step)
    if c.is_primary:
        print(f"run {run.run_number or '?'}: {c.world_size} processes, resuming at step {step}"
              + (f", batch {args.global_batch} ({local} a process)" if adaptive else ""), flush=True)
    samples = int(run.progress.report.get("samples") or step * args.global_batch)
    scale = 1.0
    if adaptive:
        run.report_batch(args.global_batch)

    def save(at: int) -> None:
        if manager.latest_step() != at:
            manager.save(at, args=ocp.args.StandardSave(state))
            manager.wait_until_finished()

    log = args.step_log.open("a") if args.step_log is not None and c.is_primary else None
    while step < args.steps:
        x, y = batch_of(step + 1)
        flag = np.array([run.stop_requested and not args.ignore_signal], dtype=np.int32)
        new_state, loss, stop, sqr_each, sqr_mean = step_fn(state, global_array(x), global_array(y),
                                                            global_array(flag), np.float32(scale))
        if bool(stop):  # every process saw the same flag: all stop before this step, together
            save(step)
            manager.close()
            run.exit_checkpointed(step)
        state, step = new_state, step + 1
        samples += args.global_batch
        if adaptive:
            noise.update(np.asarray(sqr_each).tolist(), float(sqr_mean), args.global_batch / n_grads)
            scale = lr_scale(args.global_batch, noise.init_batch, noise, args.lr_rule)
            run.report_batch(args.global_batch, noise)
            if c.is_primary and step == run.progress.report.get("resumed_from", 0) + 1:
                print(f"learning rate x{scale:.4g} at batch {args.global_batch} (submitted "
                      f"{noise.init_batch:g})", flush=True)
        if log is not None:
            log.write(f"{c.world_size} {step}\n")
            log.flush()
        run.step_done(step, samples=samples)
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            save(step)
        if args.step_seconds:
            time.sleep(args.step_seconds)
    save(step)
    manager.close()
    if c.is_primary and args.params_out is not None:
        leaves = jax.tree_util.tree_leaves_with_path(state["params"])
        np.savez(args.params_out, **{jax.tree_util.keystr(k): np.asarray(v) for k, v in leaves})
        print(json.dumps({"final_loss": float(loss), "steps": step}), flush=True)
    run.finished(step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
