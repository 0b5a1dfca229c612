"""Scheduling policies, one registry (:mod:`dl2d.policy.registry`) and six rooms:

* :mod:`dl2d.policy.elastic` — dl2d's own policies for today's all-reduce clusters: ``elastic`` (the heuristic,
  and the guardrails' fallback) and ``elastic-chooser`` (elastic's rule chosen by a learned classifier).
* :mod:`dl2d.policy.target` — today's learned policy ``dl2-target``: a learned size for every job, trained by
  slot-level PPO in the JAX simulator and online in the daemon.
* :mod:`dl2d.policy.baselines` — the schedulers dl2d is measured against: DRF, Tetris, FIFO, SRTF, Optimus,
  Tiresias, Slurm as it is, and, simulator only, Pollux and the speed oracle.
* :mod:`dl2d.policy.dl2` — the DL2 paper's policy network (``dl2``: actor-critic, imitation then RL).
* :mod:`dl2d.policy.planning` — planning on the JCT bound's linear program, in the DL2 paper's world.
* :mod:`dl2d.policy.seeds` — the other papers the project started from: Chic, Chic-Pair, the dual-agent
  scheduler and DLTAP placement.

docs/ARCHITECTURE.md says which to run and why (the figures: docs/BENCHMARKS.md).
"""
