"""dl2d's own policies for today's clusters of all-reduce jobs: ``elastic`` (shortest remaining work first at
efficient sizes, spare GPUs by marginal gain; the guardrails' fallback) and ``elastic-chooser`` (elastic's rule
chosen every few slots by a learned classifier of the cluster's state); and, for any policy, the goodput-optimal
batch of the jobs that let the scheduler choose theirs (``goodput``)."""
