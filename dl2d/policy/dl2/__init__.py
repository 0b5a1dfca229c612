"""The DL2 paper's policy (Peng et al., TPDS 2021), ``dl2``: a policy network that picks one task at a time
for a window of jobs (``slot``, ``nets``, ``config``, ``job_info``), trained by imitation of a heuristic and
then actor-critic RL in the simulator (``learn``, ``train``) and online in the daemon (``online``)."""
