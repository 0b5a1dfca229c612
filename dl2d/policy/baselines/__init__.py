"""The schedulers dl2d is measured against: DL2's baselines (DRF, Tetris, FIFO, SRTF, Optimus), Tiresias,
Slurm as it is (FIFO with backfill, never resized), and the simulator's speed oracle (a yardstick, not for a
real cluster)."""
