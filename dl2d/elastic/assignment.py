"""Parameter sharding and best-fit parameter-to-PS assignment (DL2 section 5, step 2).

The flat float32 parameter vector is cut into *blocks* (like MXNet keys):
each layer tensor is one block, and tensors larger than ``max_block``
elements are split into chunks of at most ``max_block`` elements.  A block is
the unit of placement and migration.

:func:`rebalance` is pure: given block sizes, the current block->PS map and the
new set of PSs it returns a new map such that

* every block is on exactly one live PS (none lost, none duplicated);
* blocks only move away from removed PSs or from PSs loaded above the
  average, and only while a move strictly reduces the overload
  (few parameters moved);
* moved blocks are placed best-fit: into the live PS whose remaining room
  below the average fits the block most tightly, or the least loaded PS if
  none has room.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

Block = tuple[int, int]  # (offset, length) in the flat parameter vector


def make_blocks(shapes: Iterable[tuple[str, tuple[int, ...]]], max_block: int) -> list[Block]:
    """Cut tensors (in flat order) into blocks of at most ``max_block`` elements."""
    if max_block < 1:
        raise ValueError("max_block must be >= 1")
    blocks: list[Block] = []
    off = 0
    for _name, shape in shapes:
        n = 1
        for s in shape:
            n *= int(s)
        start = 0
        while start < n:
            ln = min(max_block, n - start)
            blocks.append((off + start, ln))
            start += ln
        off += n
    return blocks


def loads(sizes: Sequence[int], assignment: Mapping[int, int], ps_ids: Iterable[int]) -> dict[int, int]:
    out = {p: 0 for p in ps_ids}
    for b, p in assignment.items():
        if p in out:
            out[p] += sizes[b]
    return out


def rebalance(sizes: Sequence[int], assignment: Mapping[int, int], ps_ids: Sequence[int]) -> dict[int, int]:
    """Return a new block->PS map over ``ps_ids`` (see module docstring).

    ``assignment`` may be empty (initial placement) or refer to PSs that are
    no longer in ``ps_ids`` (removal); blocks missing from it are placed too.
    """
    ps_ids = list(dict.fromkeys(ps_ids))
    if not ps_ids:
        raise ValueError("need at least one PS")
    live = set(ps_ids)
    total = sum(sizes)
    target = total / len(ps_ids)
    new = {b: p for b, p in assignment.items() if p in live and 0 <= b < len(sizes)}
    load = loads(sizes, new, ps_ids)
    pool = [b for b in range(len(sizes)) if b not in new]

    # Release blocks from overloaded PSs, largest first, while a move brings
    # the PS strictly closer to the target (excess > size/2).
    for p in sorted(ps_ids, key=lambda q: (-load[q], q)):
        mine = sorted((b for b, q in new.items() if q == p), key=lambda b: (-sizes[b], b))
        for b in mine:
            excess = load[p] - target
            if excess <= 0:
                break
            if 2 * excess > sizes[b] and sizes[b] > 0:
                del new[b]
                load[p] -= sizes[b]
                pool.append(b)

    # Best-fit placement, largest block first.
    for b in sorted(pool, key=lambda b: (-sizes[b], b)):
        s = sizes[b]
        fitting = [p for p in ps_ids if target - load[p] >= s]
        if fitting:
            p = min(fitting, key=lambda q: (target - load[q] - s, q))
        else:
            p = min(ps_ids, key=lambda q: (load[q], q))
        new[b] = p
        load[p] += s
    return new


def moves(old: Mapping[int, int], new: Mapping[int, int]) -> dict[int, tuple[int | None, int]]:
    """Blocks whose owner changes: ``{block: (old_ps or None, new_ps)}``."""
    return {b: (old.get(b), p) for b, p in new.items() if old.get(b) != p}


def by_ps(assignment: Mapping[int, int]) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for b, p in sorted(assignment.items()):
        out.setdefault(p, []).append(b)
    return out
