"""A sample over the cap that costs more than a rank's share: its rank gets nothing else.

Every rank runs ``m`` micro-batches. Packed level by tokens, the rank of such a sample
gets ``m - 1`` full micro-batches beside it, and the local search moves them off one
sample per sweep: 65,536 samples of 1-100 tokens and one of 64k over dp 64 ended 50% above
a schedule that is easy to build, after 64 sweeps (200 ms). Here that schedule is built
directly: each dominant sample's rank holds it and ``m - 1`` of the shortest samples, one
per micro-batch; everything else is packed by tokens over the other ranks. The caller
runs the local search from both layouts and keeps the one that ends lower.
"""

from __future__ import annotations

import numpy as np

from costmodel.scheduler.pack import assign_bins, pack_tokens
from costmodel.scheduler.sorting import longest_first

__all__ = ["dominant_alone"]


def dominant_alone(
    lens: np.ndarray, q: np.ndarray, dp: int, m: int, cap: int, bin_costs
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(bins, rank of each bin, bin costs) with each dominant sample's rank kept to it and
    ``m - 1`` singletons, or None when no sample dominates or the rest does not pack.

    Dominant: over the cap (alone in its micro-batch anyway) and at least the mean rank
    load in marginal cost ``q``. ``bin_costs(bins, k)``: quantised costs of k bins.
    """
    share = -(-int(q.sum()) // dp)  # q >= share  <=>  q · dp >= Σ q, without overflow
    is_dominant = (lens > cap) & (q >= share)
    dominant = np.flatnonzero(is_dominant)
    d = dominant.size
    k_bulk = (dp - d) * m
    if d == 0 or d >= dp or lens.size - d < d * (m - 1) + k_bulk:
        return None
    rest = np.flatnonzero(~is_dominant)
    by_length = rest[longest_first(lens[rest])]
    riders = by_length[by_length.size - d * (m - 1):]
    bulk = by_length[: by_length.size - riders.size]  # longest first still
    bulk_bins, _ = pack_tokens(lens[bulk], k_bulk, cap, np.arange(bulk.size))
    if bulk_bins is None:
        return None
    bins = np.empty(lens.size, dtype=np.int64)
    bins[bulk] = bulk_bins
    # Dominant rank j holds bins k_bulk + j*m (its sample) .. + m - 1 (one rider each).
    bins[dominant] = k_bulk + np.arange(d) * m
    bins[riders] = (k_bulk + np.repeat(np.arange(d) * m, m - 1)
                    + np.tile(np.arange(1, m), d))
    bin_q = bin_costs(bins, dp * m)
    rank_of_bin = np.empty(dp * m, dtype=np.int64)
    rank_of_bin[:k_bulk] = assign_bins(bin_q[:k_bulk], dp - d, m)
    rank_of_bin[k_bulk:] = dp - d + np.arange(d * m) // m
    return bins, rank_of_bin, bin_q
