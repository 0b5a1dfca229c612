#!/usr/bin/env bash
# Training throughput of slot-level PPO (bench/bench_ppo.py) on a GPU: the CPU figure's command at 64 parallel
# clusters, then more clusters per iteration (what a GPU is for), then `dl2ctl train` with its defaults.
# Each run's JSON lines go to $OUT (or ./gpu_out); the summary line holds train_cluster_slots_per_s and device.
#   bash bench/gpu_throughput.sh
set -u
out=${OUT:-gpu_out}; mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd) PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
run() { local name=$1; shift; echo "== $name: $*"; /usr/bin/time -f "$name wall %e s" "$@" 2>&1 | tee "$out/$name.jsonl" | grep -E 'summary|wall|Error|error' | cut -c1-600; }
common=(--eval-every 1000 --heuristics "" --eval-traces 1 --val-traces 1)
run c64 python3 bench/bench_ppo.py --iters 40 "${common[@]}"
run c512 python3 bench/bench_ppo.py --clusters 512 --iters 20 "${common[@]}"
run c2048 python3 bench/bench_ppo.py --clusters 2048 --iters 10 "${common[@]}"
run train python3 -m dl2d.cli.main train --policy dl2-target --out "$out/train.ckpt" --json
