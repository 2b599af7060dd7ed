"""Grouped schedules on inputs that are feasible by construction: how many are refused?

Each case is built from a schedule that exists: ``dp`` ranks of ``m`` micro-batches (a
multiple of ``align``), each filled with random samples up to the cap, and each rank's
samples cut into random groups; then everything is shuffled. `build_schedule` with those
group ids must place it (placement is a heuristic, so a few very tight cases can still be
refused: the count is what this measures) and every schedule it returns must keep the
invariants (`tests/test_scheduler.check_schedule`).

    PYTHONPATH=. python scripts/fuzz_grouped_schedules.py --start 10000 --count 30000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_scheduler import check_schedule  # noqa: E402  (the invariants, one definition)

from costmodel.scheduler import build_schedule  # noqa: E402


def feasible_case(rng: np.random.Generator):
    """(lengths, group ids, dp, m, cap, align) of a case some schedule satisfies."""
    dp, align = int(rng.integers(1, 7)), int(rng.choice([1, 1, 2, 3]))
    m = align * int(rng.integers(1, 10))
    cap = int(rng.choice([2, 4, 10, 16, 64, 1000]))
    more, largest_group = rng.choice([0.3, 0.5, 0.8, 1.0]), int(rng.choice([2, 5, 12]))
    lengths: list[int] = []
    groups: list[int] = []
    next_group = 0
    for _ in range(dp):
        rank: list[int] = []
        for _ in range(m):
            room = cap
            while room > 0 and (room == cap or rng.random() < more):
                length = int(rng.integers(1, room + 1))
                rank.append(length)
                room -= length
        rng.shuffle(rank)
        i = 0
        while i < len(rank):  # this rank's samples, cut into groups
            members = rank[i : i + int(rng.integers(1, largest_group + 1))]
            lengths += members
            groups += [next_group] * len(members)
            next_group += 1
            i += len(members)
    perm = rng.permutation(len(lengths))
    return np.array(lengths)[perm], np.array(groups)[perm], dp, m, cap, align


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--start", type=int, default=0, help="first seed")
    p.add_argument("--count", type=int, default=2000, help="cases (one seed each)")
    args = p.parse_args(argv)
    refused = []
    t0 = time.perf_counter()
    for seed in range(args.start, args.start + args.count):
        lengths, groups, dp, m, cap, align = feasible_case(np.random.default_rng(seed))
        try:
            s = build_schedule(lengths, dp_size=dp, max_tokens_per_microbatch=cap, align=align,
                               group_ids=groups)
        except ValueError as err:
            refused.append(seed)
            print(f"seed {seed}: n={lengths.size} dp={dp} m={m} cap={cap} align={align}: {err}")
            continue
        check_schedule(s, lengths.tolist(), dp=dp, cap=cap, align=align, group_ids=groups.tolist())
    print(f"refused {len(refused)} of {args.count} feasible cases (seeds {args.start}.."
          f"{args.start + args.count - 1}); every schedule returned kept the invariants; "
          f"{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
