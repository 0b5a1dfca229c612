"""Learning curves of the target-size policy (like DL2's Fig. 10): the held-out average JCT of the greedy policy
against the simulated cluster-slots of training, one line per run of bench/bench_ppo.py --curve-out, with the
best heuristic's (Optimus in the NumPy simulator) as a horizontal line.

    python bench/plot_ppo_curves.py docs/bench/ppo_sl.json:"SL only" docs/bench/ppo_rl.json:"RL only" \\
        docs/bench/ppo_slrl.json:"SL then RL" --out docs/bench/ppo_learning_curves.png
"""
from __future__ import annotations

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="FILE.json:label")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ylim", type=float, nargs=2, default=None)
    args = ap.parse_args()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    optimus = None
    for spec in args.runs:
        path, _, label = spec.partition(":")
        doc = json.loads(open(path).read())
        curve = doc["curve"]
        ax.plot([r["cluster_slots"] / 1e3 for r in curve], [r["mean"] for r in curve], marker="o", ms=3,
                label=label or path)
        optimus = doc["summary"]["numpy_engine"].get("optimus", {}).get("mean", optimus)
    if optimus is not None:
        ax.axhline(optimus, color="k", ls="--", lw=1, label=f"Optimus ({optimus:.1f})")
    ax.set_xlabel("training: simulated cluster-slots (thousands)")
    ax.set_ylabel("average JCT on held-out traces (slots)")
    if args.ylim:
        ax.set_ylim(*args.ylim)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(args.out)


if __name__ == "__main__":
    main()
