"""Multi-way number partitioning: Karmarkar-Karp (largest differencing) and LPT.

`karmarkar_karp` follows the k-way largest-differencing method as RL frameworks use it
(verl's and slime's `get_seqlen_balanced_partitions`): every item (or, with
``equal_size``, every group of k consecutive sorted items) starts as a partial solution of
k sets; the two partial solutions with the largest spread (max set − min set) are combined,
the heaviest set of one with the lightest of the other; repeat until one is left.

What differs from those implementations is the bookkeeping, not the method. Sets are not
Python lists copied on every merge: a partial solution is a length-k array of set sums and
one of node ids, and a merge of two non-empty sets makes one union node (at most n − 1 in
all), flattened once at the end. Ties are broken by a creation counter, never by object
identity or hashing, so the result is the same in every process.
"""

from __future__ import annotations

import heapq
import math

import numpy as np
from numpy.typing import ArrayLike

from costmodel.checks import true_or_false
from costmodel.scheduler.sorting import as_lists, members_of

__all__ = ["karmarkar_karp", "karmarkar_karp_labels", "lpt_partition", "partition_sums"]


def _weights(weights: ArrayLike, what: str = "weights") -> np.ndarray:
    arr = np.asarray(weights)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be a 1-D list of numbers, got shape {arr.shape}")
    if arr.size and arr.dtype.kind not in "iuf":
        raise ValueError(f"{what} must be numbers, got dtype {arr.dtype}")
    if arr.dtype.kind == "f" or arr.size == 0:
        arr = arr.astype(np.float64)
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{what} must be finite, got {arr[~np.isfinite(arr)][0].item()!r}")
    else:
        # Integer weights stay exact while their total fits in int64.
        big = arr.size and (int(arr.max()) > 2**62 // max(arr.size, 1))
        arr = arr.astype(np.float64) if big else arr.astype(np.int64)
    if arr.size and arr.min() < 0:
        raise ValueError(f"{what} must be non-negative, got {arr.min().item()!r}")
    return arr


def _check_k(k: int, n: int, equal_size: bool) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k (number of partitions) must be an integer >= 1, got {k!r}")
    if true_or_false(equal_size, "equal_size") and n % k:
        raise ValueError(
            f"equal_size=True needs the number of items ({n}) to be a multiple of k ({k})"
        )


def karmarkar_karp(weights: ArrayLike, k: int, equal_size: bool = False, *,
                   what: str = "weights") -> list[list[int]]:
    """Partition item indices into ``k`` sets with near-equal weight sums.

    Args:
        weights: non-negative number per item.
        k: number of sets.
        equal_size: every set gets exactly ``len(weights) / k`` items (which must divide).
        what: the weights' name in an error (a caller's own argument name).

    Returns:
        ``k`` lists of item indices, heaviest set first; indices ascending inside a set.
        Sets can be empty when there are fewer items than ``k`` (and ``equal_size`` is off).
    """
    w = _weights(weights, what)
    _check_k(k, w.size, equal_size)
    labels = _kk_labels(w, int(k), equal_size)
    return as_lists(*members_of(labels, int(k)))


def karmarkar_karp_labels(weights: ArrayLike, k: int, equal_size: bool = False, *,
                          what: str = "weights") -> np.ndarray:
    """`karmarkar_karp` as a set number per item (0 = heaviest set)."""
    w = _weights(weights, what)
    _check_k(k, w.size, equal_size)
    return _kk_labels(w, int(k), equal_size)


def _kk_labels(w: np.ndarray, k: int, equal_size: bool) -> np.ndarray:
    n = w.size
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if k == 1:
        return np.zeros(n, dtype=np.int64)

    # Ascending by weight, ties by index: the order the method consumes items in.
    order = np.lexsort((np.arange(n), w))
    dtype = w.dtype
    left = np.full(n, -1, dtype=np.int64)  # union nodes n.. : children (n - 1 at most)
    right = np.full(n, -1, dtype=np.int64)
    next_node = n

    # A partial solution: (sums desc, node ids; -1 = empty set). Singletons are kept lazy
    # (no k-arrays until merged), so memory stays O(n + k · live merged states).
    sums: dict[int, np.ndarray] = {}
    nodes: dict[int, np.ndarray] = {}
    heap: list[tuple] = []
    counter = 0

    def push(state: int, spread, top) -> None:
        # Largest spread first, then the largest top set; then creation order.
        heapq.heappush(heap, (-spread, -top, state))

    if equal_size:
        for start in range(0, n, k):
            ids = order[start : start + k][::-1]  # descending within the group
            s = w[ids].copy()
            sums[counter] = s
            nodes[counter] = ids.astype(np.int64)
            push(counter, s[0] - s[-1], s[0])
            counter += 1
    else:
        for idx in order.tolist():
            # Lazy singleton: {w, 0, ..., 0}, spread w.
            push(counter, w[idx], w[idx])
            nodes[counter] = np.array([idx], dtype=np.int64)
            counter += 1

    def materialise(state: int) -> tuple[np.ndarray, np.ndarray]:
        s = sums.pop(state, None)
        ids = nodes.pop(state)
        if s is None:  # lazy singleton
            full_s = np.zeros(k, dtype=dtype)
            full_ids = np.full(k, -1, dtype=np.int64)
            full_s[0] = w[ids[0]]
            full_ids[0] = ids[0]
            return full_s, full_ids
        return s, ids

    while len(heap) > 1:
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        sa, na = materialise(a)
        sb, nb = materialise(b)
        # Heaviest of one with the lightest of the other.
        sb = sb[::-1]
        nb = nb[::-1]
        merged = sa + sb
        if equal_size:  # every set holds items: each pair of sets becomes a union node
            left[next_node - n : next_node - n + k] = na
            right[next_node - n : next_node - n + k] = nb
            new_nodes = np.arange(next_node, next_node + k, dtype=np.int64)
            next_node += k
            perm = np.argsort(-merged, kind="stable")  # the lexsort below, with no empty set
        else:
            both = (na >= 0) & (nb >= 0)
            new_nodes = np.where(na >= 0, na, nb)
            c = int(both.sum())
            if c:
                ids = np.arange(next_node, next_node + c, dtype=np.int64)
                left[next_node - n : next_node - n + c] = na[both]
                right[next_node - n : next_node - n + c] = nb[both]
                new_nodes[both] = ids
                next_node += c
            # Heaviest first; among equal sums, non-empty sets before empty ones, so zero
            # weights still fill every set (verl breaks such ties by item count the same way).
            perm = np.lexsort((new_nodes < 0, -merged))
        merged = merged[perm]
        new_nodes = new_nodes[perm]
        sums[counter] = merged
        nodes[counter] = new_nodes
        push(counter, merged[0] - merged[-1], merged[0])
        counter += 1

    _, _, last = heap[0]
    _, final_nodes = materialise(last)
    # Every item's set: follow union nodes up to the final sets, by pointer jumping
    # (each pass doubles the distance covered), vectorised over all nodes.
    total = next_node
    up = np.arange(total, dtype=np.int64)
    internal = np.arange(n, total, dtype=np.int64)
    up[left[: total - n]] = internal
    up[right[: total - n]] = internal
    while True:
        nxt = up[up]
        if np.array_equal(nxt, up):
            break
        up = nxt
    set_of_node = np.full(total, -1, dtype=np.int64)
    roots = final_nodes[final_nodes >= 0]
    set_of_node[roots] = np.flatnonzero(final_nodes >= 0)
    return set_of_node[up[:n]]


def lpt_partition(weights: ArrayLike, k: int) -> list[list[int]]:
    """Longest-processing-time greedy: heaviest item first, onto the lightest set.

    Ties: equal weights are taken in index order, and equal set sums go to the lower set
    index. Returns ``k`` lists of indices, ascending inside each set.
    """
    w = _weights(weights)
    _check_k(k, w.size, False)
    k = int(k)
    order = np.lexsort((np.arange(w.size), -w)).tolist()
    heap = [(0, r) for r in range(k)]
    sets: list[list[int]] = [[] for _ in range(k)]
    vals = w.tolist()
    for idx in order:
        total, r = heapq.heappop(heap)
        sets[r].append(idx)
        heapq.heappush(heap, (total + vals[idx], r))
    for s in sets:
        s.sort()
    return sets


def partition_sums(weights: ArrayLike, partitions: list[list[int]]) -> list[float]:
    """Exactly rounded sum of the weights in each set (math.fsum)."""
    w = np.asarray(weights, dtype=np.float64)
    return [math.fsum(w[p].tolist()) if len(p) else 0.0 for p in partitions]
