"""Samples over the cap that outweigh a micro-batch: their ranks get only the rest of a share.

Every rank runs ``m`` micro-batches. Packed level by tokens, the rank of such a sample
gets ``m - 1`` full micro-batches beside it, and the local search moves them off one
sample per sweep: 65,536 samples of 1-100 tokens and one of 64k over dp 64 ended 50% above
a schedule that is easy to build, after 64 sweeps (200 ms), and a sample just under a
rank's share 79% above. Here that schedule is built directly: each heavy sample's rank
holds it and, in its other ``m - 1`` micro-batches, what is left of a rank's share (an
even slice of every length; the shortest samples, one per micro-batch, where the sample
alone reaches the share); everything else is packed by tokens over the other ranks. The
caller runs the local search from these layouts and the level one, and keeps the lowest.

Shares are measured on the level layout's micro-batch costs (the cost itself, fixed costs
included), not on marginal sample costs: under a measured profile 65,536 samples of 1-100
tokens add up, one by one, to twice what their micro-batches cost.
"""

from __future__ import annotations

import itertools

import numpy as np

from costmodel.scheduler.pack import MAX_ROUNDS, assign_bins, pack_tokens, rank_makespan
from costmodel.scheduler.pack_ranks import pack_each_rank
from costmodel.scheduler.sorting import longest_first

__all__ = ["heavy_apart"]

Layout = tuple[np.ndarray, np.ndarray, np.ndarray, int]  # bins, rank of each bin, costs, m
# A layout whose costliest rank starts within this of a share needs no second count.
_AT_SHARE = 1e-3
# Counts a set of heavy samples is tried at: three steps, then 2% more each (~12% in all).
_COUNTS_TRIED = 8


def heavy_apart(
    lens: np.ndarray,
    level: tuple[np.ndarray, np.ndarray],
    dp: int,
    m_range: tuple[int, int, int],
    cap: int,
    bin_costs,
) -> list[Layout]:
    """Layouts with each heavy sample's rank kept to it and the rest of a share: one per
    set of heavy samples below that packs, two where the next count may balance better
    (none when no sample is heavy).

    ``level``: the level packing's (bin of each sample, quantised bin costs), dp × m bins.
    ``m_range``: (its m, most allowed, step). The other ranks hold all the rest, so a
    layout may need more micro-batches per rank: the fewest their tokens allow, and up to
    two steps more where levelling needs room. ``bin_costs(bins, k)``: costs of k bins.

    Heavy: over the cap (alone in its micro-batch anyway) and costing at least an average
    micro-batch; then, as other starts (many heavy ranks apart can leave the rest too
    little room or balance), those costing half a share (two cannot share a rank without
    passing it), and those costing a whole share.
    """
    level_bins, level_q = level
    m_lo, m_hi, step = m_range
    total = int(level_q.sum())
    share = -(-total // dp)  # whole units: no int64 product of costs and dp
    over = np.flatnonzero(lens > cap)
    alone = level_q[level_bins[over]]  # an over-cap sample is alone in its level bin
    by_cost = np.lexsort((over, -alone))  # costliest first, ties by index
    over, alone = over[by_cost], alone[by_cost]
    layouts: list[Layout] = []
    tried: set[int] = set()
    for floor in (-(-share // m_lo), -(-share // 2), share):
        d = int((alone >= floor).sum())
        if d in tried or d == 0 or d >= dp:
            continue
        tried.add(d)
        heavy = over[:d]
        is_rest = np.ones(lens.size, dtype=bool)
        is_rest[heavy] = False
        rest = np.flatnonzero(is_rest)
        by_length = rest[longest_first(lens[rest])]
        # Each heavy rank's fraction of the rest: what its sample leaves of a share.
        rest_cost = max(1, total - int(alone[:d].sum()))
        fractions = [max(0, share - int(a)) / rest_cost for a in alone[:d].tolist()]
        first = _fewest_for_the_rest(lens, by_length, fractions, dp - d, m_lo, step, cap)
        # Counts from the fewest the rest's tokens allow, one step at a time, then by 2%
        # while levelling finds no room (samples near the cap: 1,023 of up to 999 tokens at a cap of 1,024
        # built only 5% above it, and at most two steps more left the layout out: 1.60x
        # the lower bound). Then the next count too, unless the first starts at a share or
        # every heavy sample alone reaches one (more riders only add to its rank): where the
        # rest only just fits the other ranks' caps, they cannot take the heavy ranks'
        # excess (half a share apart at dp 16: 1.020x the bound at the first count, 1.002x
        # at the next).
        settled = not any(fractions)
        m, built_at = first, None
        for tries in itertools.count(1):
            if m > m_hi or (tries > _COUNTS_TRIED and built_at is None):
                break  # (a layout built on the last try still gets its next count)
            built = _apart(lens, heavy, by_length, fractions, dp, m, cap, bin_costs)
            if built is not None:
                layouts.append((*built, m))
                _, rank_of_bin, bin_q = built
                if (settled or built_at is not None
                        or rank_makespan(rank_of_bin, bin_q, dp) <= share * (1 + _AT_SHARE)):
                    break
                built_at = m
            elif built_at is not None:
                break
            grow = built_at is None and tries > 2  # one step at a time first, as before
            m = max(m + step, -(-m * 51 // 50 // step) * step) if grow else m + step
    return layouts


def _fewest_for_the_rest(lens, by_length, fractions, ranks, m_lo, step, cap) -> int:
    """The fewest micro-batches per rank (a multiple of ``step``, at least ``m_lo``) whose
    cap holds, on ``ranks`` ranks, what the heavy ranks leave of the rest."""
    riders = _riders(by_length, fractions, max(0, m_lo - 1))
    tokens = int(np.minimum(lens[by_length], cap).sum()) - sum(int(lens[r].sum()) for r in riders)
    need = -(-tokens // (ranks * cap))
    return max(m_lo, -(-need // step) * step)


def _apart(lens, heavy, by_length, fractions, dp, m, cap, bin_costs):
    """One layout at ``m`` micro-batches per rank, or None where something does not pack."""
    d = heavy.size
    k_bulk = (dp - d) * m
    if by_length.size < d * (m - 1) + k_bulk:
        return None
    riders = _riders(by_length, fractions if m > 1 else [0.0] * d, m - 1)
    taken = np.zeros(lens.size, dtype=bool)
    for mine in riders:
        taken[mine] = True
    bulk = by_length[~taken[by_length]]  # longest first still
    if bulk.size < k_bulk:
        return None
    bins = np.empty(lens.size, dtype=np.int64)
    bulk_bins, _ = pack_tokens(lens[bulk], k_bulk, cap, np.arange(bulk.size))
    if bulk_bins is None:
        return None
    bins[bulk] = bulk_bins
    # Heavy rank j holds bins k_bulk + j*m (its sample) and + 1 .. + m - 1 (its riders).
    bins[heavy] = k_bulk + np.arange(d) * m
    if m > 1 and not _pack_riders(lens, riders, m - 1, cap, bins, k_bulk + 1, m):
        return None
    bin_q = bin_costs(bins, dp * m)
    rank_of_bin = np.empty(dp * m, dtype=np.int64)
    rank_of_bin[:k_bulk] = assign_bins(bin_q[:k_bulk], dp - d, m)
    rank_of_bin[k_bulk:] = dp - d + np.arange(d * m) // m
    return bins, rank_of_bin, bin_q


def _pack_riders(lens, riders, k, cap, bins, first_bin, stride) -> bool:
    """Pack each heavy rank's riders into its ``k`` micro-batches: rank j's into bins
    ``first_bin + j * stride + 0 .. k - 1`` (in ``bins``, in place). All ranks in one numpy
    pass where `pack_ranks` can (the same micro-batches as `pack_tokens` rank by rank: at
    dp 1,024 with 0.5% of 65,536 samples over the cap, 1,614 calls were 0.3 s); False
    where some rank's do not pack."""
    flat = np.concatenate(riders) if riders else np.zeros(0, dtype=np.int64)
    rank_of = np.repeat(np.arange(len(riders)), [r.size for r in riders])
    # A rank's riders are longest first already (ties by index): that is their order.
    slots = pack_each_rank(lens[flat], rank_of, len(riders), k, cap, MAX_ROUNDS,
                           lambda mine: pack_tokens(mine, k, cap, np.arange(mine.size))[0])
    if slots is None:
        return False
    bins[flat] = first_bin + rank_of * stride + slots
    return True


def _riders(by_length: np.ndarray, fractions: list[float], slots: int) -> list[np.ndarray]:
    """For each heavy rank, the samples beside its heavy one, longest first: its fraction
    of the rest as an even slice of every length (so what the other ranks pack keeps its
    mix too), and at least ``slots`` of them (one per micro-batch: the shortest left).

    One pass for all ranks: a pool of every k-th sample (longest first) as large as the
    fractions together (all of it where they ask for more: heavy samples just under a share
    each), dealt out evenly spaced, each rank in proportion to its fraction.
    """
    n, d = by_length.size, len(fractions)
    asked = float(sum(fractions))
    in_pool = np.diff(np.floor(np.arange(1, n + 1) * min(1.0, asked)), prepend=0.0) > 0
    pool = np.flatnonzero(in_pool)  # positions in by_length, ascending: longest first
    counts = np.zeros(d, dtype=np.int64)
    if pool.size and asked > 0:
        exact = np.asarray(fractions, dtype=np.float64) / asked * pool.size
        counts = np.floor(exact).astype(np.int64)
        extra = pool.size - int(counts.sum())  # largest remainders, ties to the lower rank
        counts[np.lexsort((np.arange(d), -(exact - counts)))[:extra]] += 1
    # Rank j's turns fall at (k + 1/2) / counts[j]: merged, each rank's share is spread
    # evenly over the pool, and so over every length.
    owners = np.repeat(np.arange(d), counts)
    turns = np.concatenate([(np.arange(c) + 0.5) / c for c in counts.tolist() if c]
                           or [np.zeros(0)])
    owner_of_pool = owners[np.lexsort((owners, turns))]  # pool[p] goes to owner_of_pool[p]
    by_owner = np.argsort(owner_of_pool, kind="stable")  # each owner's run stays ascending
    bounds = np.r_[0, np.cumsum(counts)]
    spare = np.flatnonzero(~in_pool)  # shortest last
    end = spare.size
    out = []
    for j in range(d):
        mine = pool[by_owner[bounds[j]:bounds[j + 1]]]
        if mine.size < slots:
            take = spare[max(0, end - (slots - mine.size)):end]
            end -= take.size
            mine = np.sort(np.concatenate([mine, take]))
        out.append(by_length[mine])
    return out
