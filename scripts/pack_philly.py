"""Make dl2d/workload/data/pollux/philly.csv.gz from the Pollux artifact's simulator/traces/philly.csv: the two
columns dl2d uses (num_gpus, duration in whole seconds), gzip-compressed with a fixed timestamp so the file is
reproducible byte for byte.

    python scripts/pack_philly.py PATH/TO/philly.csv
"""
from __future__ import annotations

import csv
import gzip
import io
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "dl2d/workload/data/pollux/philly.csv.gz"


def main(source: str) -> None:
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(["num_gpus", "duration"])
    with open(source, newline="") as f:
        for n, row in enumerate(csv.DictReader(f), 2):
            try:
                out.writerow([int(row["num_gpus"]), int(round(float(row["duration"])))])
            except (KeyError, TypeError, ValueError):
                sys.exit(f"{source} line {n}: num_gpus and duration must be numbers")
    OUT.write_bytes(gzip.compress(buf.getvalue().encode(), mtime=0))
    print(f"wrote {OUT.name}: {buf.getvalue().count(chr(10)) - 1} jobs")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
