"""Near-equal lengths: swapping many samples at once against one change per rank pair.

    PYTHONPATH=. python benchmarks/bench_near_equal.py [--quick] [--json out.json]

Batches whose samples all lie within a few tokens of each other (``c ± k`` tokens, c a
third of the cap: three to a micro-batch, and three of the longest do not fit), as when
most responses hit one length limit. There a swap moves a few tokens between ranks hundreds
or thousands apart. Each batch is scheduled twice in this process, balancing tokens or
FLOPs:

- ``bulk``: `build_schedule` as it is, where a rank pair whose best single change moves
  under 1/64 of its gap swaps many samples at once (`scheduler.refine_many.bulk_swaps`);
- ``one by one``: the same code with bulk swaps switched off (one change per pair and
  sweep: what the scheduler did before 2026-12-02).

Reported: makespan over the lower bound, local-search changes applied, and wall time (best
of a few runs, one process), with the ratio of the two times.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from pathlib import Path
from unittest import mock

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_scheduler import best_time, write_cases  # noqa: E402
from costmodel.scheduler import build_schedule, refine  # noqa: E402

CAP = 8192
SIZES = (20_000, 50_000, 100_000)
DPS = (64, 256)
COSTS = ("tokens", "flops")
SPREAD = 2  # c ± 2 tokens


def near_equal(n: int, seed: int) -> np.ndarray:
    c = CAP // 3 - SPREAD  # 2,728-2,732 at cap 8,192
    return np.random.default_rng(seed).integers(c - SPREAD, c + SPREAD + 1, n)


def _no_bulk_swaps(st, ia, pa, short, gap, *rest) -> np.ndarray:
    return np.zeros(gap.size, dtype=bool)


def run(sizes, repeats: int) -> list[dict]:
    print(f"{'n':>7} {'dp':>4} {'cost':6} | {'one by one: ms/lb':>17} {'changes':>7} {'ms':>7} | "
          f"{'bulk: ms/lb':>11} {'changes':>7} {'ms':>7} | {'time ratio':>10}")
    rows = []
    for n in sizes:
        lengths = near_equal(n, seed=0)
        for dp in DPS:
            for cost in COSTS:
                call = functools.partial(build_schedule, lengths, dp_size=dp,
                                         max_tokens_per_microbatch=CAP, cost=cost,
                                         spec="qwen3-8b")
                row: dict = dict(n=n, dp=dp, cost=cost, cap=CAP, spread=SPREAD)
                for name, switch in (
                    ("one_by_one", mock.patch.object(refine, "bulk_swaps", _no_bulk_swaps)),
                    ("bulk", contextlib.nullcontext()),
                ):
                    with switch:
                        ms, s = best_time(call, repeats)
                    row[name] = dict(makespan_over_lower_bound=s.makespan_over_lower_bound,
                                     changes=s.stats["local_search_steps"], wall_ms=ms)
                row["time_ratio"] = row["bulk"]["wall_ms"] / row["one_by_one"]["wall_ms"]
                rows.append(row)
                a, b = row["one_by_one"], row["bulk"]
                print(f"{n:7} {dp:4} {cost:6} | {a['makespan_over_lower_bound']:17.6f} "
                      f"{a['changes']:7} {a['wall_ms']:7.1f} | "
                      f"{b['makespan_over_lower_bound']:11.6f} {b['changes']:7} "
                      f"{b['wall_ms']:7.1f} | {row['time_ratio']:10.3f}")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="n = 50,000 only, timed once")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    sizes, repeats = (SIZES[1:2], 1) if args.quick else (SIZES, 3)
    rows = run(sizes, repeats)
    if args.json:
        write_cases(args.json, rows, cap=CAP, lengths=f"cap/3 - {SPREAD} ± {SPREAD} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
