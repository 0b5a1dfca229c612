"""Trace seeds as the commands and benchmarks take them: ``N``, ``LO-HI`` (both included) or a comma-separated
list of either (``2000-2009,2012-2018``)."""
from __future__ import annotations


def seed_list(text: str) -> list[int]:
    """The seeds ``text`` names, in its order; ValueError naming the text where a part is no seed or range."""
    out: list[int] = []
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        first, _, last = part.partition("-")
        try:
            lo, hi = int(first), int(last or first)
        except ValueError:
            raise ValueError(f"seeds must be N, FIRST-LAST or a comma-separated list of them, got {text!r}") from None
        if hi < lo:
            raise ValueError(f"seeds {part!r}: the last is below the first")
        out.extend(range(lo, hi + 1))
    if not out:
        raise ValueError(f"no seeds in {text!r}")
    return out
