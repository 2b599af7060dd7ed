"""Karmarkar-Karp as the drop-ins run it, against the same method on Python lists.

    PYTHONPATH=. python benchmarks/bench_partition.py [--quick] [--json out.json]

verl and slime run largest differencing (`get_seqlen_balanced_partitions`) in every step:
with equal set sizes for a step's DP balance (n samples over k ranks), with any sizes for
one rank's micro-batches (verl's ``rearrange_micro_batches``: n samples over
``ceil(Σ L / cap)`` micro-batches). Their implementations keep each partial solution as k
lists of items, concatenated on every merge and sorted as lists. The baseline here is that
bookkeeping, written from the method's definition with the same tie rules as
`costmodel.scheduler.karmarkar_karp` (so both give the same set sums, which is checked):
the ratio is the bookkeeping's, not a different method's. Weights: verl's workload proxy
``24576·L + L²`` over RL-like lengths. Best of three, one process.
"""

from __future__ import annotations

import argparse
import heapq
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_scheduler import best_time, write_cases  # noqa: E402
from costmodel.scheduler import generate_lengths, karmarkar_karp  # noqa: E402

# (n, k, equal_size): a step's DP balance, then one rank's micro-batches.
CASES = (
    (1024, 8, True), (4096, 64, True), (8192, 1024, True), (65536, 256, True),
    (256, 4, False), (1024, 16, False), (4096, 64, False), (16384, 128, False),
)


def list_karmarkar_karp(weights: list[int], k: int, equal_size: bool) -> list[list[int]]:
    """Largest differencing with every set a (sum, items) pair, new lists on every merge."""
    order = sorted(range(len(weights)), key=lambda i: (weights[i], i))
    heap = []
    if equal_size:
        starts = [[(weights[i], [i]) for i in reversed(order[s : s + k])]
                  for s in range(0, len(order), k)]
    else:
        starts = [[(weights[i], [i])] + [(0, [])] * (k - 1) for i in order]
    for counter, sets in enumerate(starts):
        heap.append((-(sets[0][0] - sets[-1][0]), -sets[0][0], counter, sets))
    heapq.heapify(heap)
    counter = len(heap)
    while len(heap) > 1:
        a = heapq.heappop(heap)[3]
        b = heapq.heappop(heap)[3]
        merged = [(sa + sb, ia + ib) for (sa, ia), (sb, ib) in zip(a, reversed(b))]
        # Heaviest first; equal sums: non-empty before empty, then position (stable).
        merged.sort(key=lambda s: (-s[0], not s[1]))
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), -merged[0][0], counter, merged))
        counter += 1
    return [sorted(items) for _, items in heap[0][3]]


def run_case(n: int, k: int, equal_size: bool, repeats: int) -> dict:
    lengths = generate_lengths(n, "rl", seed=n + k).astype(np.int64)
    weights = (24576 * lengths + lengths**2).tolist()
    ours_ms, ours = best_time(lambda: karmarkar_karp(weights, k, equal_size), repeats)
    base_ms, base = best_time(lambda: list_karmarkar_karp(weights, k, equal_size), repeats)
    sums = [sorted(sum(weights[i] for i in s) for s in parts) for parts in (ours, base)]
    if sums[0] != sums[1]:
        raise AssertionError(f"n {n}, k {k}: the two give different set sums")
    return dict(n=n, k=k, equal_size=equal_size, ours_ms=ours_ms, lists_ms=base_ms,
                ratio=ours_ms / base_ms)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the cases up to 4,096 items, once")
    p.add_argument("--json", help="write the cases here")
    args = p.parse_args(argv)
    cases = [c for c in CASES if c[0] <= 4096] if args.quick else CASES
    print(f"{'n':>6} {'k':>5} {'sizes':>6} | {'ours ms':>8} {'lists ms':>9} {'ratio':>6}")
    rows = []
    for n, k, equal_size in cases:
        row = run_case(n, k, equal_size, 1 if args.quick else 3)
        rows.append(row)
        print(f"{n:6} {k:5} {'equal' if equal_size else 'any':>6} | {row['ours_ms']:8.1f} "
              f"{row['lists_ms']:9.1f} {row['ratio']:6.3f}")
    if args.json:
        write_cases(args.json, rows, weights="24576*L + L^2 over rl lengths")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
