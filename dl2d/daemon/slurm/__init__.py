"""The Slurm backend of the daemon: one Slurm batch job per dl2d job (design: docs/slurm.md).

One module per concern, the logic pure and the I/O in thin shells:

* :mod:`~dl2d.daemon.slurm.mapping` (pure): a job's demand and a target -> the Slurm allocation to ask
  for (node shape, allocation rule, whether held nodes host a size, node selection from a placement);
* :mod:`~dl2d.daemon.slurm.planning` (pure): how to take a job from what Slurm reports to its target
  (start / hot / restart / shrink / stop / noop), its status, its progress;
* :mod:`~dl2d.daemon.slurm.jobdir`: the per-job directory (record, target file, batch script, the
  files the job writes);
* :mod:`~dl2d.daemon.slurm.settings`: :class:`SlurmBackendConfig` and the ``[slurm]`` table of
  dl2d.toml (:class:`SlurmSection`, checked by dl2d/daemon/config.py);
* :mod:`~dl2d.daemon.slurm.backend`: :class:`SlurmBackend`, the I/O shell that talks to Slurm through a
  :class:`~dl2d.slurm.driver.SlurmDriver`.

Nothing is imported here, so that dl2d/daemon/config.py can import the settings without the backend.
"""
