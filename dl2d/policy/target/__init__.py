"""Today's learned policy, ``dl2-target``: a target size for every job from a network, filled in shortest
remaining work order; its pure-JAX form (``policy``), its SlotView shell (``view``), slot-level PPO on the JAX
environment (``ppo``, ``train``), the heuristics it warms up from (``teachers``, ``marginal``) and online
learning in the daemon with a revert rule (``online``)."""
