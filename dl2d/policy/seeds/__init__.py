"""The other papers dl2d was seeded with: Chic and Chic-Pair (cross-entropy method, ``chic``, ``chic_train``),
the dual-agent scheduler (``dual_agent``, ``dual_agent_train``) and DLTAP's network-aware placement
(``dltap``, which re-places any policy's tasks)."""
