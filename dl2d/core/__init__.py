"""The scheduling contract every side of dl2d speaks: the simulator, the policies, the daemon, the backends.

- :mod:`dl2d.core.jobs` — a job's kind (PS or all-reduce) and per-task demand, as data; read from a spec.
- :mod:`dl2d.core.limits` — the per-job task limits (16 workers, 16 PS by default).
- :mod:`dl2d.core.contract` — what a policy sees (:class:`SlotView`) and returns (:class:`Allocation`),
  the :class:`Scheduler` protocol, :class:`CapacityError`.
- :mod:`dl2d.core.placement` — least-loaded task placement (:class:`Placer`) and the capacity check of an
  allocation (:func:`place_servers`).
- :mod:`dl2d.core.files` — atomic file writes, bounded reads of regular files, secret files.
- :mod:`dl2d.core.listener` — every listener's bounds (a deadline per request, a share per peer, reserved
  slots, a fixed thread bound).

It imports nothing else of dl2d (an import-linter contract in CI holds that).
"""
