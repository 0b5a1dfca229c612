"""The PyTorch recipe of dl2d's job contract (docs/jobs.md): DistributedDataParallel, gloo on CPU (nccl on
GPUs), resized by checkpoint-restart.

dl2d starts one process per worker with its own ``srun`` (``launch = "srun"``, the all-reduce default); each
reads its rank, the world size and the rendezvous address from ``dl2d.job``. The batch of global step ``s``
is keyed on ``(seed, s)`` and split evenly over the ranks, so a resize changes who computes a step, not what
it computes. Rank 0 saves the model and optimizer with ``dl2d.job``'s checkpoints (renamed into place when
whole); every rank restores the latest one.

    dl2ctl submit -J mlp --arch allreduce --type mlp --epochs 1 --workers 2 \\
        --wrap 'python examples/torch_ddp.py --steps 2000'

PyTorch is not one of dl2d's dependencies (its CPU build does not install from PyPI within the limits of
dl2d's CI); the JAX example (examples/jax_allreduce.py) is the one the tests run on Slurm.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

import dl2d.job


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2000, help="global steps to train in all")
    p.add_argument("--global-batch", type=int, default=48, help="samples per global step (all ranks; 48 splits "
                   "over 1, 2, 3 and 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--checkpoint-every", type=int, default=200)
    p.add_argument("--checkpoint-dir", default=None, help="where to keep checkpoints when dl2d does not say")
    p.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step (for tests)")
    p.add_argument("--params-out", default=None, help="at the end, rank 0 writes the parameters here (.npz)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = dl2d.job.start(total_steps=args.steps, checkpoint_dir=args.checkpoint_dir)
    c = run.contract
    if args.global_batch % c.world_size:
        print(f"global batch {args.global_batch} does not split over {c.world_size} ranks", file=sys.stderr)
        return 2

    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    device = torch.device(f"cuda:{c.local_rank}" if backend == "nccl" else "cpu")
    if c.coordinator:
        dist.init_process_group(backend, init_method=f"tcp://{c.coordinator}", rank=c.rank,
                                world_size=c.world_size)
    else:  # a world of one (started by hand): no rendezvous
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(args.seed)
    data_rng = np.random.default_rng(args.seed)
    xs = torch.tensor(data_rng.normal(size=(4096, 16)), dtype=torch.float32)
    ys = torch.sin(xs @ torch.tensor(data_rng.normal(scale=0.25, size=(16, 1)), dtype=torch.float32))
    local = args.global_batch // c.world_size

    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    step = 0
    latest = run.checkpoints.latest()  # only whole checkpoints are listed
    if latest is not None:
        state = torch.load(latest.path / "state.pt", map_location=device)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = latest.step
    ddp = DistributedDataParallel(model)
    run.resumed(step)
    if c.is_primary:
        print(f"run {run.run_number or '?'}: {c.world_size} ranks, resuming at step {step}", flush=True)

    def save(at: int) -> None:
        latest = run.checkpoints.latest()
        if c.is_primary and (latest is None or latest.step != at):
            with run.checkpoints.save(at) as d:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, d / "state.pt")
        dist.barrier()  # nobody exits (or goes on) before the checkpoint is whole

    def leave() -> None:
        """Take the distributed runtime down while the interpreter is whole. Left to the interpreter's
        teardown, DDP's reducer and gloo's work objects die with it, which once aborted a rank after the last
        barrier ("terminate called without an active exception", exit -6) in dl2d's CI."""
        nonlocal ddp
        ddp = None
        gc.collect()  # DDP's hooks hold the module in cycles: free the reducer now, not at exit
        dist.destroy_process_group()

    stop = torch.zeros(1, dtype=torch.int32)
    while step < args.steps:
        stop.fill_(int(run.stop_requested))
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # the ranks agree on the step they stop at
        if stop.item():
            save(step)
            leave()
            run.exit_checkpointed(step)
        idx = np.random.default_rng([args.seed, step + 1]).choice(len(xs), args.global_batch, replace=False)
        mine = torch.as_tensor(idx[c.rank * local:(c.rank + 1) * local])
        loss = torch.nn.functional.mse_loss(ddp(xs[mine].to(device)), ys[mine].to(device))
        opt.zero_grad()
        loss.backward()  # DDP all-reduces (averages) the gradients here
        opt.step()
        step += 1
        run.step_done(step, samples=step * args.global_batch)
        if args.checkpoint_every and step % args.checkpoint_every == 0:
            save(step)
        if args.step_seconds:
            time.sleep(args.step_seconds)
    save(step)
    leave()
    if c.is_primary and args.params_out:
        np.savez(args.params_out, **{k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})
    run.finished(step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
