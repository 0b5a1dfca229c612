"""Planning with the JCT bound's linear program, in the DL2 paper's world of PS jobs: the program solved from
where the cluster stands (``lp_plan``), a lookahead over its roundings on a speed table learned from
simulated runs (``learned_speeds``, ``lp_lookahead``), and the network that reads the plan and learns where
to depart from it (``plan_net``, trained by ``plan_distill``)."""
