"""The schedulers dl2d is measured against: DL2's baselines (DRF, Tetris, FIFO, SRTF, Optimus), Tiresias,
Slurm as it is (FIFO with backfill, never resized), and, simulator only (yardsticks, not for a real cluster),
Pollux (goodput with the batch) and the speed oracle."""
