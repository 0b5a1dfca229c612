"""A bench's output: each row printed as one JSON line when it is made, and kept in ``--out`` as it goes.

Why written as it goes: the long benches (bench_mpc, bench_styles) run for tens of minutes, and a run stopped
halfway keeps the rows it made. The file is opened (emptied) before the first row, so a path that cannot be
written fails at once, not at the end.
"""
from __future__ import annotations

import json


class Rows:
    def __init__(self, out: str | None):
        self.rows: list[dict] = []
        try:
            self._file = open(out, "w") if out else None
        except OSError as e:
            raise SystemExit(f"--out: cannot write {out}: {e.strerror}") from None

    def add(self, row: dict) -> dict:
        print(json.dumps(row), flush=True)
        self.rows.append(row)
        if self._file:
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()
        return row

    def close(self) -> None:
        if self._file:
            self._file.close()

    def __enter__(self) -> "Rows":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
