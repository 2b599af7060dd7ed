"""`pack.pack_tokens` for every rank at once: the same micro-batches, in numpy rounds over
all ranks instead of a Python loop over ranks.

Grouped placement packs each rank's samples into its ``m`` micro-batches on its own; at dp
1,024 that was 1,024 calls of ~0.1-0.27 ms each per placement try (0.1-0.27 s), up to five
tries per schedule. Here round t of every rank runs in one pass (~15 ms for the 1,024
ranks; `groups` uses it from 16 ranks, below which the loop is as fast): a rank's rounds
are the same as `pack._pack_tokens` takes (its first round, then half rounds or
water-filled level rounds at the same positions, decided by the same tests), with the same
arithmetic (integer fills; the levels' float sums row by row, as the 1-D sums), so every
rank gets exactly the micro-batches `pack_tokens` gives it. A rank off that path (fewer
samples than ``m``, more samples over the cap than ``m``, a sample that does not fit where
its round put it, ``m`` = 1) is left to `pack_tokens` by the caller.
"""

from __future__ import annotations

import numpy as np

from costmodel.scheduler.sorting import (
    longest_first,
    members_of,
    running_sums,
    segments,
    stable_order,
)

__all__ = ["pack_each_rank", "pack_ranks"]


def pack_each_rank(
    lengths: np.ndarray, rank_of: np.ndarray, dp: int, m: int, cap: int, max_rounds: int,
    pack_one, *, batched: bool = True,
) -> np.ndarray | None:
    """Each sample's micro-batch on its rank (0..m-1), or None where a rank's do not pack:
    `pack_ranks` for the ranks it packs (``batched``), ``pack_one(lengths of one rank, in
    sample order)`` -> slots or None for the others, one by one."""
    if batched:
        slots, packed = pack_ranks(lengths, rank_of, dp, m, cap, max_rounds)
    else:
        slots, packed = np.zeros(lengths.size, dtype=np.int64), np.zeros(dp, dtype=bool)
    by_rank, bounds = members_of(rank_of, dp)
    for r in np.flatnonzero(~packed).tolist():
        idx = by_rank[bounds[r] : bounds[r + 1]]
        mine = pack_one(lengths[idx])
        if mine is None:
            return None
        slots[idx] = mine
    return slots


def pack_ranks(
    lengths: np.ndarray, rank_of: np.ndarray, dp: int, m: int, cap: int, max_rounds: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each sample's micro-batch on its rank (0..m-1), and per rank whether that holds (False:
    pack that rank with `pack.pack_tokens`; its entries are meaningless)."""
    n = lengths.size
    # Rank by rank, longest first, ties by index: each rank's `longest_first` order. Two
    # stable sorts of small keys (radix sorts), not a lexsort of three: 65,536 samples over
    # 1,024 ranks 14 -> 3 ms, once per placement try.
    order = longest_first(lengths)
    order = order[stable_order(rank_of[order])]
    lo = lengths[order]
    count = np.bincount(rank_of, minlength=dp)
    start = np.concatenate([[0], np.cumsum(count)[:-1]])
    # Samples over the cap come first in a rank's order and close micro-batches 0, 1, ...
    n_over = np.bincount(rank_of, weights=lengths > cap, minlength=dp).astype(np.int64)
    open_bins = m - n_over
    # Packed here: ranks of at least m samples, at most m of them over the cap (exactly m
    # only if nothing else: no micro-batch left open), and m > 1 (pack_tokens' shortcut).
    good = (count >= m) & (n_over <= m) & ((open_bins > 0) | (count == n_over)) & (m > 1)
    csum = np.concatenate([[0], np.cumsum(lo)])  # chunk sums: exact int64 differences
    slot_sorted = np.full(n, -1, dtype=np.int64)
    fill = np.zeros((dp, m), dtype=np.int64)
    ids = np.arange(m)
    # First round: the m longest, one per micro-batch.
    first = np.flatnonzero(good)
    fill[first] = lo[start[first][:, None] + ids]
    slot_sorted[(start[first][:, None] + ids).ravel()] = np.tile(ids, first.size)
    pos = np.where(good, m, count)
    many = -(-(count - m) // max_rounds) if max_rounds > 0 else np.zeros(dp, dtype=np.int64)
    half = np.maximum(1, open_bins // 2)
    closed = ids < n_over[:, None]
    while True:
        active = np.flatnonzero(good & (pos < count))
        if active.size == 0:
            slots = np.empty(n, dtype=np.int64)
            slots[order] = slot_sorted  # not slot_sorted[np.argsort(order)]: a scatter, not a sort
            return slots, good
        p, c, o = pos[active], np.minimum(many[active], count[active] - pos[active]), open_bins[active]
        at = start[active] + p
        level = (c > o) & (lo[at] * o <= csum[at + c] - csum[at])
        c = np.where(level, c, np.minimum(half[active], count[active] - p))
        # Each rank's open micro-batches emptiest first (key fill·m + id, as `_pack_tokens`),
        # then the closed ones.
        key = np.where(closed[active], np.iinfo(np.int64).max, fill[active] * m + ids)
        by_key = np.argsort(key, axis=1, kind="stable")
        for is_level in (False, True):
            sel = np.flatnonzero(level == is_level)
            if sel.size:
                args = (lo, fill, slot_sorted, active[sel], at[sel], c[sel], by_key[sel])
                ok = _level_rounds(*args, o[sel], cap) if is_level else _half_rounds(*args, cap)
                good[active[sel][~ok]] = False
        pos[active] += c


def _half_rounds(lo, fill, slot_sorted, ranks, at, c, by_key, cap) -> np.ndarray:
    """The i-th sample of each chunk into its rank's i-th emptiest micro-batch; per rank,
    whether every one fits."""
    row, place = segments(c)  # each sample's chunk and place in it
    b = by_key[row, place]
    length = lo[at[row] + place]
    fits = fill[ranks[row], b] + length <= cap
    ok = np.bincount(row, weights=~fits, minlength=c.size) == 0
    keep = ok[row]
    fill[ranks[row][keep], b[keep]] += length[keep]
    slot_sorted[(at[row] + place)[keep]] = b[keep]
    return ok


def _level_rounds(lo, fill, slot_sorted, ranks, at, c, by_key, open_bins, cap) -> np.ndarray:
    """`pack._level_round` for one chunk per rank: water-fill the emptiest open micro-batches
    and give each sample the one where it starts; per rank, whether every one fits. Columns
    past a rank's open micro-batches (its closed ones) take no part."""
    row, place = segments(c)  # each sample's chunk and place in it
    length = lo[at[row] + place]
    first_of_chunk = np.cumsum(c) - c
    ends = running_sums(length, row, first_of_chunk)
    starts = ends - length
    m = by_key.shape[1]
    is_open = np.arange(m) < open_bins[:, None]
    f = np.take_along_axis(fill[ranks], by_key, axis=1).astype(np.float64)
    total = ends[first_of_chunk + c - 1].astype(np.float64)
    levels = (total[:, None] + np.cumsum(f, axis=1)) / np.arange(1, m + 1)
    j = m - 1 - np.argmax(((levels >= f) & is_open)[:, ::-1], axis=1)
    deficits = np.where(is_open, np.maximum(levels[np.arange(c.size), j][:, None] - f, 0.0), 0.0)
    cum = np.cumsum(deficits, axis=1)
    slot = np.minimum((cum[row] <= starts[:, None].astype(np.float64)).sum(axis=1),
                      open_bins[row] - 1)
    new_run = (place == 0) | (slot != np.concatenate([[-1], slot[:-1]]))
    first = np.maximum.accumulate(np.where(new_run, np.arange(row.size), 0))
    b = by_key[row, slot]
    fits = fill[ranks[row], b] + ends - starts[first] <= cap
    ok = np.bincount(row, weights=~fits, minlength=c.size) == 0
    keep = ok[row]
    np.add.at(fill, (ranks[row][keep], b[keep]), length[keep])
    slot_sorted[(at[row] + place)[keep]] = b[keep]
    return ok
