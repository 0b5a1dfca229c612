"""What the world's training jobs are like: job types (DL2's eight models) and their speed models.

Shared knowledge, not a side of the system: the simulator takes it as ground truth, the policies take it as
their belief (Optimus's parametric fit), the daemon compares measured speeds with it. Imports only dl2d.core.
"""
