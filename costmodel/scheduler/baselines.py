"""Today's baseline, re-implemented: what RL frameworks (slime's `build_dp_schedule`, verl's
dynamic batching) do, for comparison in `benchmarks/bench_scheduler.py` and `simulate`.

``first-fit`` (slime's default with ``balance_data``):
  1. first-fit packing by tokens, samples in input order (each goes to the first
     micro-batch with room; a sample over the cap opens its own);
  2. micro-batch count raised to a multiple of ``dp × align`` by repeatedly splitting the
     micro-batch with the most tokens into two halves balanced by tokens (LPT);
  3. Karmarkar-Karp with equal set sizes over each micro-batch's summed per-sample FLOPs,
     micro-batches to ranks.

``kk-samples`` (slime's ``balance_by_flops``): step 1 becomes Karmarkar-Karp over
per-sample FLOPs into ``ceil(Σ tokens / cap)`` micro-batches (one per sample if that is not
fewer than the samples), which balances FLOPs between micro-batches but ignores the cap.

Same decisions as those implementations; only the bookkeeping is faster where theirs is
quadratic (first fit finds the first micro-batch with room through a max-tree of remaining
room instead of scanning every micro-batch), so the baseline's wall time in the benchmark
is, if anything, flattering to it.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from costmodel.scheduler.partition import karmarkar_karp

__all__ = [
    "BASELINES",
    "baseline_microbatches",
    "align_bins",
    "expand_bins_by_splitting",
    "first_fit_pack",
    "first_fit_then_karmarkar_karp",
]

BASELINES = ("first-fit", "kk-samples")


def first_fit_pack(lengths, cap: int) -> list[list[int]]:
    """First fit by tokens, in input order: each sample into the first micro-batch with
    room, else a new one. Returns micro-batches of sample indices."""
    lens = [int(x) for x in lengths]
    n = len(lens)
    size = 1
    while size < max(n, 1):
        size *= 2
    # Max-tree over each micro-batch's remaining room; unopened ones have room `cap`
    # (a sample longer than the cap fits none and opens a new one).
    tree = [cap] * (2 * size)
    bins: list[list[int]] = []
    for i, length in enumerate(lens):
        if length <= cap and tree[1] >= length:
            node = 1
            while node < size:
                node = 2 * node if tree[2 * node] >= length else 2 * node + 1
            b = node - size
        else:
            b = len(bins)
        if b == len(bins):
            bins.append([])
        bins[b].append(i)
        node = b + size
        tree[node] = tree[node] - length if length <= cap else -1  # over the cap: closed
        node //= 2
        while node:
            tree[node] = max(tree[2 * node], tree[2 * node + 1])
            node //= 2
    return bins


def _split_by_tokens(indices: list[int], lengths) -> tuple[list[int], list[int]]:
    halves: list[list[int]] = [[], []]
    sums = [0, 0]
    for i in sorted(indices, key=lambda x: -lengths[x]):
        h = 0 if sums[0] <= sums[1] else 1
        halves[h].append(i)
        sums[h] += lengths[i]
    return halves[0], halves[1]


def expand_bins_by_splitting(bins: list[list[int]], target: int, lengths) -> None:
    """Grow ``bins`` in place to ``target`` by splitting the micro-batch with the most
    tokens (ties: the later one) into two token-balanced halves; stops when none has two
    samples."""
    # A heap of (-tokens, -index) over those with two samples or more: the same choice as
    # scanning every micro-batch for the fullest, without the scan per split (136 ms at
    # 16,384 RL samples, dp 64; 2.7 s at 65,536). A micro-batch's tokens change only when
    # it is split, so no entry goes stale.
    def entry(k: int) -> tuple[int, int]:
        return -sum(lengths[i] for i in bins[k]), -k

    heap = [entry(k) for k, b in enumerate(bins) if len(b) > 1]
    heapq.heapify(heap)
    while len(bins) < target and heap:
        k = -heapq.heappop(heap)[1]
        bins[k], right = _split_by_tokens(bins[k], lengths)
        bins.append(right)
        for half in (k, len(bins) - 1):
            if len(bins[half]) > 1:
                heapq.heappush(heap, entry(half))


def align_bins(bins: list[list[int]], align_to: int, lengths) -> None:
    """Split the largest micro-batches until their count is a positive multiple of
    `align_to` (dp_size × micro-batch group), as slime does; ValueError when it cannot."""
    target = max(-(-len(bins) // align_to) * align_to, align_to)
    expand_bins_by_splitting(bins, target, lengths)
    if len(bins) != target:
        raise ValueError(
            f"{len(lengths)} samples cannot make {target} micro-batches "
            f"(a multiple of dp_size × micro-batch group = {align_to}); bring more samples "
            f"per step or lower dp_size"
        )


def baseline_microbatches(
    lengths,
    *,
    dp_size: int,
    max_tokens_per_microbatch: int,
    sample_flops: np.ndarray,
    variant: str = "first-fit",
    align: int = 1,
) -> list[list[list[int]]]:
    """Per-rank micro-batches (lists of sample indices) as the baseline builds them.

    ``sample_flops``: per-sample FLOPs (the baseline's workload estimate).
    """
    if variant not in BASELINES:
        raise ValueError(f"variant must be one of {BASELINES}, got {variant!r}")
    lens = [int(x) for x in lengths]
    cap = int(max_tokens_per_microbatch)
    work: Any = np.asarray(sample_flops, dtype=np.float64)
    if variant == "first-fit":
        bins = first_fit_pack(lens, cap)
    else:
        k = max(1, -(-sum(lens) // cap))
        bins = [[i] for i in range(len(lens))] if k >= len(lens) else karmarkar_karp(work, k)
    align_bins(bins, dp_size * align, lens)
    weights = [float(work[b].sum()) for b in bins]
    ranks = karmarkar_karp(weights, dp_size, equal_size=True)
    return [[sorted(bins[k]) for k in sorted(part)] for part in ranks]


def _sample_flops(lengths, spec) -> np.ndarray:
    from costmodel.flops import sequence_fwd_flops
    from costmodel.spec import ModelSpec

    if not isinstance(spec, ModelSpec):
        spec = ModelSpec.from_any(spec)
    return sequence_fwd_flops(lengths, spec)


def first_fit_then_karmarkar_karp(
    lengths, *, dp_size: int, max_tokens_per_microbatch: int, spec, align: int = 1
) -> list[list[list[int]]]:
    """The common baseline (``first-fit``), with per-sample FLOPs of ``spec``."""
    return baseline_microbatches(
        lengths,
        dp_size=dp_size,
        max_tokens_per_microbatch=max_tokens_per_microbatch,
        sample_flops=_sample_flops(lengths, spec),
        variant="first-fit",
        align=align,
    )
