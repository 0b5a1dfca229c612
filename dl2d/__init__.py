"""dl2d: a DL2-style learning scheduler for Slurm GPU clusters."""

__version__ = "0.1.0"
