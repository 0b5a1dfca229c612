#!/usr/bin/env bash
# `dl2ctl train` (today's world) on a GPU: its defaults (64 parallel clusters), then PPO over 1024 clusters an
# iteration, 16 times the samples per update, to see whether a wider batch lets PPO improve on its warm-up: with
# each job credited for its own time (the default), then, from that run's kept warm-up, with the slot's
# allocation as one action (--credit slot). About 7.5 minutes on an H100.
# Each run's JSON goes to $OUT (or ./gpu_out); each is cut at its own time limit so the whole fits one call.
#   bash bench/gpu_train.sh
set -u
out=${OUT:-gpu_out}; mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd) PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import jax; print('jax', jax.__version__, jax.devices())"
run() { local name=$1 limit=$2; shift 2; echo "== $name: $*"
  /usr/bin/time -f "$name wall %e s" timeout "$limit" "$@" > "$out/$name.json" 2> "$out/$name.err"
  tail -n 2 "$out/$name.err"
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(sys.argv[1], r['val_jct_slots'], r['chosen'], \
'slots/s', r['cluster_slots_per_s'], 'wall', r['wall_s']); print([(c['phase'], c['iter'], c['val_mean']) for c in r['curve']])" \
    "$out/$name.json" 2>/dev/null || echo "$name: no result"; }
run train64 200 python3 -m dl2d.cli.main train --out "$out/train64.msgpack" --json
run train1024 330 python3 -m dl2d.cli.main train --clusters 1024 --rl-iters 40 --eval-every 5 \
  --out "$out/train1024.msgpack" --json
run slot1024 190 python3 -m dl2d.cli.main train --init "$out/train1024.msgpack" --sl-iters 0 --rl-iters 30 \
  --clusters 1024 --credit slot --eval-every 5 --out "$out/slot1024.msgpack" --json
