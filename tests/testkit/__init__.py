"""Helpers shared by the test suite, one module per area (importable as ``testkit.<area>``: pytest puts tests/
on the path, pyproject's ``pythonpath``). Real components only: helpers build inputs and start processes,
they fake nothing the tests assert on (the in-memory Slurm driver is dl2d.slurm.memory, in the package)."""
