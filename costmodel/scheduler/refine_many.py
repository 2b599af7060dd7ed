"""Changes of many samples at once, for `refine`'s sweeps where one change per rank pair
would take hundreds of sweeps: a batch of small samples moved from one micro-batch
(`apply_batches`), and many near-equal samples swapped, one per micro-batch
(`bulk_swaps`). Each books its changes into the `refine.BinState` it is given.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from costmodel.scheduler.sorting import (
    first_min_per_pair,
    run_starts,
    running_sums,
    segments,
    stable_order,
)

if TYPE_CHECKING:
    from costmodel.scheduler.refine import BinState

__all__ = ["apply_batches", "bulk_swaps"]


def apply_batches(
    st: BinState,
    ia: np.ndarray,
    pa: np.ndarray,
    gap: np.ndarray,
    pair_err: np.ndarray,
    dst: np.ndarray,
    a_ranks: np.ndarray,
    b_ranks: np.ndarray,
) -> np.ndarray:
    """Move a batch of samples from one micro-batch of each pair's heavy rank A into B's
    roomiest micro-batch ``dst[pair]``. Returns which pairs moved one.

    A pair whose best single change is short of its gap (error ``pair_err`` over half the
    gap, as in `refine._sweep`) tries every batch that is a prefix, costliest first, of one A
    micro-batch's samples that may leave (each micro-batch keeps its costliest one) and fit
    ``dst``. Each is priced exactly (a separable cost's token part is the curve at the new
    fills: a sample's marginal cost at one fill misses the curve's steps by up to 10x), and
    the pair takes its lowest new maximum if that beats its single change.
    """
    moved = np.zeros(gap.size, dtype=bool)
    starved = pair_err > gap // 2  # not 2 · pair_err > gap: refine._NONE would overflow
    mine = np.flatnonzero(starved[pa])
    if mine.size == 0:
        return moved
    ia, pa = ia[mine], pa[mine]
    q, bins = st.q[ia], st.bin_of[ia]
    by_bin = np.lexsort((ia, -q, bins))  # the first of each micro-batch stays
    sorted_bins = bins[by_bin]
    stays = run_starts(sorted_bins)
    q_sorted = q[by_bin]
    order = by_bin[~stays & (q_sorted > 0) & (2 * q_sorted <= gap[pa[by_bin]])]
    if order.size == 0:
        return moved
    src, pair, samples = bins[order], pa[order], ia[order]
    to = dst[pair]
    new_run = run_starts(src)
    run = np.cumsum(new_run) - 1
    first = np.flatnonzero(new_run)
    tokens = running_sums(st.lengths[samples], run, first)
    fits = tokens <= st.cap - st.fill[to]
    part = running_sums(st.part[samples], run, first)
    new_src, new_to = st.priced(src, -tokens, -part), st.priced(to, tokens, part)
    a, b = a_ranks[pair], b_ranks[pair]
    value = np.maximum(st.load[a] - st.bin_q[src] + new_src, st.load[b] - st.bin_q[to] + new_to)
    # A batch of one is a single move: `refine._sweep` has weighed those.
    ok = fits & (np.arange(order.size) > first[run]) & (value < st.load[a])
    ok &= 2 * value - st.load[a] - st.load[b] < pair_err[pair]  # beats the single change
    cand = np.flatnonzero(ok)
    if cand.size == 0:
        return moved
    best = cand[first_min_per_pair(pair[cand], value[cand])]  # ties: the shorter prefix
    # Apply each pair's batch (pairs hold distinct ranks, so no index repeats below).
    last = np.full(first.size, -1, dtype=np.int64)
    last[run[best]] = best
    go = np.arange(order.size) <= last[run]
    st.bin_of[samples[go]] = to[go]
    st.book(src[best], to[best], tokens[best], best + 1 - first[run[best]], new_src[best],
            new_to[best])
    moved[pair[best]] = True
    return moved


def bulk_swaps(
    st: BinState,
    ia: np.ndarray,
    pa: np.ndarray,
    short: np.ndarray,
    gap: np.ndarray,
    a_ranks: np.ndarray,
    b_ranks: np.ndarray,
    pair_err: np.ndarray,
) -> np.ndarray:
    """Where a pair's gap is many times its best single change (``short[pair]``), swap the
    costliest samples of A's micro-batches with the cheapest of B's, k-th with k-th, as long
    as their transfers add up to at most half the gap. Additive costs only (a transfer is
    then exact). Returns which pairs swapped.

    A pair swaps only where the swaps together come closer to half its gap than its best
    single change (error ``pair_err[pair]``, as in `refine._sweep`), which it replaces: where that
    was a move of a whole sample and the swaps trade near-equal ones, they moved a millionth
    of it, and the search stalled (dp 2, 1,000 samples of 1,170 +- 5 tokens, five 16x the
    cap of 8,192, tokens: 1.0429x the bound where the single moves reach 1.00004x).

    Near-equal lengths need this: 100,000 samples of 2,728-2,732 tokens at cap 8,192 over dp
    256 moved 4 tokens per pair and sweep, where a pair was a thousand apart (the search
    ran out of sweeps at max/mean 1.0008, 2 s).
    Each micro-batch takes part in one swap at most, so each swap's cap check holds alone.
    """
    swapped = np.zeros(gap.size, dtype=bool)
    if not short.any():
        return swapped
    q, lengths, bin_of = st.q, st.lengths, st.bin_of
    # A side: each micro-batch's costliest sample, by pair and cost (descending).
    on_a = np.flatnonzero(short[pa])
    if on_a.size == 0:
        return swapped
    a_items, a_pair = ia[on_a], pa[on_a]
    a_items, a_pair = _one_per_bin(a_items, a_pair, -q[a_items], bin_of)
    # B side: each micro-batch's cheapest sample, by pair and cost (ascending).
    pair_b = np.full(st.dp, -1, dtype=np.int64)
    pair_b[b_ranks[short]] = np.flatnonzero(short)
    pb_all = pair_b[bin_of // st.m]
    ib = np.flatnonzero(pb_all >= 0)
    b_items, b_pair = _one_per_bin(ib, pb_all[ib], q[ib], bin_of)
    # Match the k-th of A with the k-th of B in each pair.
    n_pairs = gap.size
    a_count = np.bincount(a_pair, minlength=n_pairs)
    b_count = np.bincount(b_pair, minlength=n_pairs)
    a_seg, a_k = segments(a_count)
    b_start = np.cumsum(b_count) - b_count
    has = a_k < b_count[a_seg]
    i = a_items[has]
    pair = a_seg[has]
    j = b_items[b_start[pair] + a_k[has]]
    d = q[i] - q[j]  # falls with k: A's costs fall, B's rise
    bi, bj = bin_of[i], bin_of[j]
    grow = lengths[i] - lengths[j]
    fits = ((st.count[bi] == 1) | (st.fill[bi] - grow <= st.cap)) & (
        (st.count[bj] == 1) | (st.fill[bj] + grow <= st.cap))
    # A swap over half the gap (a long sample at k = 0) could never be in the prefix below:
    # left out, it no longer keeps the smaller ones after it out too.
    ok = (d > 0) & (2 * d <= gap[pair]) & fits
    i, j, pair, d, bi, bj, grow = (x[ok] for x in (i, j, pair, d, bi, bj, grow))
    if i.size == 0:
        return swapped
    new_run = run_starts(pair)
    seg = np.cumsum(new_run) - 1
    take = 2 * running_sums(d, seg, np.flatnonzero(new_run)) <= gap[pair]
    i, j, pair, d, bi, bj, grow = (x[take] for x in (i, j, pair, d, bi, bj, grow))
    total = np.zeros(n_pairs, dtype=np.int64)
    np.add.at(total, pair, d)
    beats = (gap - 2 * total < pair_err)[pair]  # pair_err may be refine._NONE: no 2 · pair_err
    i, j, pair, d, bi, bj, grow = (x[beats] for x in (i, j, pair, d, bi, bj, grow))
    if i.size == 0:
        return swapped
    # Book (every micro-batch once; a pair's ranks many times: loads by np.add.at).
    st.fill[bi] -= grow
    st.fill[bj] += grow
    st.bin_q[bi] -= d
    st.bin_q[bj] += d
    np.add.at(st.load, a_ranks[pair], -d)
    np.add.at(st.load, b_ranks[pair], d)
    bin_of[i], bin_of[j] = bj, bi
    swapped[pair] = True
    return swapped


def _one_per_bin(items: np.ndarray, pair: np.ndarray, key: np.ndarray, bin_of: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Of ``items`` (ascending, with their ``pair``), the one with the lowest ``key`` in each
    micro-batch (ties: the lower index), ordered by (pair, key, index). One stable sort by
    micro-batch and a minimum per run (a lexsort of all three keys took 4.5 ms a call at
    85,000 samples, and twice the sweep's other work)."""
    by_bin = stable_order(bin_of[items])  # within a micro-batch, ascending items
    bins, keys = bin_of[items[by_bin]], key[by_bin]
    new_bin = run_starts(bins)
    run = np.cumsum(new_bin) - 1
    lowest = np.minimum.reduceat(keys, np.flatnonzero(new_bin))
    at_lowest = np.flatnonzero(keys == lowest[run])
    first = run_starts(run[at_lowest])
    keep = by_bin[at_lowest[first]]
    keep = keep[np.lexsort((items[keep], key[keep], pair[keep]))]
    return items[keep], pair[keep]
