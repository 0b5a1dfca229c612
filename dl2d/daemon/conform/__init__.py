"""The conformance harness: one trace of short jobs run by dl2d on a real Slurm and in its simulated twin,
compared slot by slot (``dl2ctl conform``, docs/BENCHMARKS.md).

* :mod:`.trace` (pure): the trace, each job's declared speed curve and its submission, as a user makes it;
* :mod:`.compare` (pure): two worlds' records -> allocations agreed, the first divergence and its cause,
  starts, resizes, idle GPUs, JCTs, makespan;
* :mod:`.worlds`: runs the twin in this process and the real world as ``dl2d`` on Slurm, and reads back what
  each database recorded (and, every slot, what Slurm held).
"""
