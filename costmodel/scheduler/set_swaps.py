"""Swaps that even out sets of fixed sizes: after Karmarkar-Karp with equal set sizes.

Karmarkar-Karp with equal sizes leaves the sets apart by about one large item's share:
2,048 groups of 8 RL-like responses over 256 sets of 8 groups came out 15% over the mean
under verl's workload proxy (64 groups over 8 sets, 6% under the H200 profile), where swaps
bring them within 0.03%. Each sweep pairs heavy sets with light ones as the scheduler's local
search pairs ranks (`refine.pair_ranks`), finds for every item of a heavy set the light
items that come closest to halving its pair's gap (`refine.swap_partners`), and applies, per
pair, the swap that lowers the pair's larger sum most. Where the sweeps stall, the heaviest
set alone trades with any other. On integer weights, so every process gets the same result.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from costmodel.scheduler.partition import karmarkar_karp_labels
from costmodel.scheduler.refine import pair_ranks, swap_partners
from costmodel.scheduler.sorting import first_min_per_pair

__all__ = ["balance_by_swaps", "karmarkar_karp_then_swaps"]

_NONE = np.iinfo(np.int64).max
_MAX_SWEEPS = 64
# Sweeps in a row that may leave the heaviest set as it was before the rest is left to
# `_heaviest_first`, which takes a pass over all items per swap (8,192 prompts over 1,024
# ranks: 2 took 31-73 ms in all, 4 31-48, 64 40-65, about as even).
_PATIENCE = 4
# Done once the heaviest set is this close to the mean: the scheduler's own tolerance
# (`refine._REL_TOL`), under the run-to-run noise of a GPU step.
_REL_TOL = 2.5e-4
# Items the heaviest-first swaps may look at in all (each swap looks at every item): 8,192
# samples over 1,024 sets took 1,565 swaps to get from 8.7% over the mean to 0.24% (0.4 s),
# the first 256 to 0.88%.
_HEAVIEST_FIRST_ITEMS = 1 << 21
# Weights become integers whose total is under 2**_BITS, as the scheduler's costs: every
# sum stays exact, and `refine.swap_partners`' keys (pair x (largest + gap)) fit int64 for
# up to ~2**17 pairs.
_BITS = 44


def karmarkar_karp_then_swaps(weights: ArrayLike, k: int, equal_size: bool = True, *,
                              what: str = "weights") -> np.ndarray:
    """A set 0..k-1 per item: `karmarkar_karp_labels` (its checks, ``what`` naming the
    weights in an error), then `balance_by_swaps`."""
    labels = karmarkar_karp_labels(weights, k, equal_size, what=what)
    return balance_by_swaps(np.asarray(weights), labels, k)


def balance_by_swaps(weights: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """``labels`` (a set 0..k-1 per item) after swaps of one item for another between a
    heavy and a light set, each set keeping its size; returns the new labels. ``weights``:
    finite, non-negative."""
    q = _integers(np.asarray(weights))
    labels = np.array(labels, dtype=np.int64)
    _sweeps(q, labels, k)
    _heaviest_first(q, labels, k)
    return labels


def _even(load: np.ndarray) -> bool:
    mean = int(load.sum()) / load.size
    return int(load.max()) - mean <= _REL_TOL * mean


def _loads(q: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    return np.bincount(labels, weights=q, minlength=k).astype(np.int64)  # exact: < 2**53


def _sweeps(q: np.ndarray, labels: np.ndarray, k: int) -> None:
    """Swaps between many pairs of sets at once (in place), the bulk of the work."""
    idle = 0
    top, stale = None, 0
    for sweep in range(_MAX_SWEEPS):
        load = _loads(q, labels, k)
        pairs = pair_ranks(load, 0, sweep % 2 == 0)
        if pairs is None or _even(load):
            return
        if top is None or load.max() < top:
            top, stale = int(load.max()), 0
        else:
            stale += 1  # the heaviest set is pinned in its pair: over to _heaviest_first
            if stale == _PATIENCE:
                return
        a_sets, b_sets, gap, pair_a, pair_b = pairs
        ia = np.flatnonzero(pair_a[labels] >= 0)
        pa = pair_a[labels[ia]]
        load_a, load_b = load[a_sets[pa]], load[b_sets[pa]]
        pair_b_of = pair_b[labels]
        values, partners = [], []
        for j in swap_partners(pa, q[ia], gap[pa], pair_b_of, q, int(gap.max())):
            d = q[ia] - q[j]
            ok = (pair_b_of[j] == pa) & (d > 0)
            values.append(np.where(ok, np.maximum(load_a - d, load_b + d), _NONE))
            partners.append(j)
        if not values:
            return
        best = np.min(values, axis=0)
        cand = np.flatnonzero(best < load_a)  # strictly lowers the pair's larger sum
        if cand.size == 0:
            idle += 1  # the other way of pairing may still find swaps
            if idle == 2:
                return
            continue
        idle = 0
        win = cand[first_min_per_pair(pa[cand], best[cand])]
        i = ia[win]
        j = np.stack(partners)[np.argmin(values, axis=0)[win], win]
        labels[i], labels[j] = labels[j], labels[i].copy()


def _heaviest_first(q: np.ndarray, labels: np.ndarray, k: int) -> None:
    """Then, one at a time, the swap between the heaviest set and any other that lowers
    the larger of the two most (in place): the sweeps pair each set with one other only,
    and stopped 1.4% over the mean where this reaches 0.4% (256 groups of 16 bimodal
    samples over 64 sets)."""
    load = _loads(q, labels, k)
    for _ in range(_HEAVIEST_FIRST_ITEMS // max(q.size, 1) + 1):
        if _even(load):
            return
        a = int(np.argmax(load))
        mine = np.flatnonzero(labels == a)
        by_weight = mine[np.argsort(q[mine], kind="stable")]
        mine_q, other_load = q[by_weight], load[labels]
        # Trading item i for item j of set b leaves the larger of the two at
        # max(S_a - d, S_b + d), d = q_i - q_j: V-shaped in d, lowest at half the gap, so for
        # each j the best i is one of the two whose weights lie either side of q_j + gap / 2.
        # (An item of a itself has no gap: no such swap lowers anything.)
        near = np.searchsorted(mine_q, q + (load[a] - other_load) // 2)
        best, swap = load[a], None
        for i in (near - 1, near):
            i = np.clip(i, 0, mine_q.size - 1)
            d = mine_q[i] - q
            pair = np.where(d > 0, np.maximum(load[a] - d, other_load + d), _NONE)
            j = int(np.argmin(pair))
            if pair[j] < best:
                best, swap = pair[j], (int(by_weight[i[j]]), j)
        if swap is None:
            return
        i, j = swap
        b = int(labels[j])
        labels[i], labels[j] = b, a
        load[a] += q[j] - q[i]
        load[b] += q[i] - q[j]


def _integers(w: np.ndarray) -> np.ndarray:
    """The weights as int64 with a total under 2**_BITS: integers as they are where it
    fits, otherwise (and floats) scaled by a power of two and rounded."""
    total = float(w.sum(dtype=np.float64))
    if w.dtype.kind in "iu" and total < 2.0**_BITS:
        return w.astype(np.int64)
    if total <= 0:
        return np.zeros(w.size, dtype=np.int64)
    # frexp, not log2: the same scale on every CPU (numpy's log2 may differ in the last bit);
    # ldexp, not a factor 2.0**e: under a total of 2**-971 that factor is past the largest float.
    return np.round(np.ldexp(w.astype(np.float64), _BITS - math.frexp(total)[1])).astype(np.int64)
