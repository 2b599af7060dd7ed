"""Grouped schedules (a prompt's responses on one rank) against the same batch ungrouped.

    PYTHONPATH=. python benchmarks/bench_grouped.py [--quick] [--cost-model h200/qwen3-8b] [--json out.json]

For rl and bimodal lengths, several (n, dp, group size, cap), two schedules of the same
batch under the same cost: with ``group_ids`` (whole groups per rank) and without. The
ungrouped one is the baseline: what the group constraint costs. Reported: makespan over
the lower bound and max/mean of each, the grouped makespan's excess over the ungrouped one,
and the wall time of each (best of three, one process) with their ratio.
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_scheduler import best_time, write_cases  # noqa: E402
from costmodel.model import load_cost_model  # noqa: E402
from costmodel.scheduler import build_schedule, generate_lengths  # noqa: E402

# (n, dp, group size, cap): groups that fit one micro-batch (2-4 responses at 16-32k) and
# groups that do not (8-16 RL responses at 16k).
CASES = (
    (512, 8, 4, 32768),
    (2048, 16, 2, 16384),
    (4096, 64, 4, 32768),
    (8192, 64, 2, 32768),
    (512, 8, 8, 16384),
    (2048, 16, 8, 16384),
    (4096, 64, 16, 16384),
    (8192, 64, 8, 16384),
    # Large jobs: many ranks, 64 samples each.
    (16384, 256, 16, 16384),
    (65536, 1024, 8, 32768),
)


def _run(cases, runs: int, cost) -> list[dict]:
    print(f"{'dist':8} {'n':>5} {'dp':>4} {'group':>5} {'cap':>6} | grouped: mk/lb  max/mean   ms | "
          "ungrouped: mk/lb  max/mean   ms | grouped over ungrouped: makespan  time")
    rows = []
    for dist in ("rl", "bimodal"):
        for n, dp, size, cap in cases:
            lengths = generate_lengths(n, dist, seed=n + dp)
            ids = [i // size for i in range(n)]
            kw = dict(spec="qwen3-8b", dp_size=dp, max_tokens_per_microbatch=cap, cost=cost)
            ms, g = best_time(functools.partial(build_schedule, lengths, group_ids=ids, **kw), runs)
            u_ms, u = best_time(functools.partial(build_schedule, lengths, **kw), runs)
            rows.append(dict(dist=dist, n=n, dp=dp, group_size=size, cap=cap,
                             grouped=dict(makespan_over_lower_bound=g.makespan_over_lower_bound,
                                          max_over_mean=g.imbalance, wall_ms=ms),
                             ungrouped=dict(makespan_over_lower_bound=u.makespan_over_lower_bound,
                                            max_over_mean=u.imbalance, wall_ms=u_ms),
                             grouped_over_ungrouped=g.makespan / u.makespan,
                             grouped_time_over_ungrouped=ms / u_ms))
            print(f"{dist:8} {n:5} {dp:4} {size:5} {cap:6} | {g.makespan_over_lower_bound:13.4f} "
                  f"{g.imbalance:9.4f} {ms:5.0f} | {u.makespan_over_lower_bound:15.4f} "
                  f"{u.imbalance:9.4f} {u_ms:4.0f} | {g.makespan / u.makespan:32.4f} {ms / u_ms:5.1f}")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="two cases per distribution, timed once")
    p.add_argument("--cost-model", default="h200/qwen3-8b",
                   help="a cost model file or shipped name, or tokens / flops")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    cases, runs = (CASES[:2], 1) if args.quick else (CASES, 3)
    cost = args.cost_model if args.cost_model in ("tokens", "flops") else load_cost_model(args.cost_model)
    print(f"cost: {args.cost_model}")
    logging.disable(logging.WARNING)  # the over-cap notes, once per case
    try:
        rows = _run(cases, runs, cost)
    finally:
        logging.disable(logging.NOTSET)  # main() may run inside a test session
    if args.json:
        write_cases(args.json, rows, cost=args.cost_model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
