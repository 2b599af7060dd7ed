"""The scheduler with and without its split start (full micro-batches, a few split), in one run.

    PYTHONPATH=. python benchmarks/bench_fill_shapes.py [--quick]
        [--json benchmarks/results/bench_fill_shapes_h200.json]

Under a cost that prices how full a micro-batch is, `build_schedule` also searches from best
fit's micro-batches filled towards the cap, the fullest split in two until the count is
reached (the common baseline's shape), where those fills cost less in all than level ones
(`scheduler/counts.py`, up to 4,096 samples). For RL-like batches (rl and bimodal lengths,
dp 8-64, 16-64 samples a rank, caps 8k-32k, three seeds) under the shipped H200 profile in
training and forward mode and priced per GPU at context parallelism 4 (forward) and 8
(training), each batch is scheduled with the start and without it (the same code, its gate
turned off), and by the common baseline. Reported per cost: batches the start made
shorter, the mean and largest gain, batches where the baseline's schedule is shorter than
ours (by the same cost) with and without the start, and the wall time with it over without
(median, 90th percentile, largest; best of 3 each, one process). Predictions under the
profile, on the CPU: nothing is timed on a GPU here.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_scheduler import write_cases  # noqa: E402
from costmodel.flops import sequence_fwd_flops  # noqa: E402
from costmodel.model import load_cost_model  # noqa: E402
from costmodel.scheduler import (  # noqa: E402
    baseline_microbatches,
    build_schedule,
    counts,
    evaluate_schedule,
    generate_lengths,
)

PROFILE = "h200/qwen3-8b"
DPS = (8, 16, 32, 64)
PER_RANK = (16, 32, 64)
CAPS = (8192, 16384, 32768)
SEEDS = (0, 1, 2)


def costs(model) -> dict[str, tuple[object, str]]:
    """Each judged cost: (cost, mode)."""
    return {"train": (model, "train"), "forward": (model, "forward"),
            "cp4 forward": (model.for_context_parallel(4), "forward"),
            "cp8 train": (model.for_context_parallel(8), "train")}


def schedule(lengths, dp, cap, cost, mode, split: bool):
    """`build_schedule`, with the split start or without it (its gate says no), and its
    best wall time of 3."""
    gate = counts._full_fills_may_cost_less
    if not split:
        counts._full_fills_may_cost_less = lambda *args: False
    try:
        best, s = np.inf, None
        for _ in range(3):
            t = time.perf_counter()
            s = build_schedule(lengths, dp_size=dp, max_tokens_per_microbatch=cap, cost=cost,
                               mode=mode)
            best = min(best, time.perf_counter() - t)
    finally:
        counts._full_fills_may_cost_less = gate
    return s, best * 1e3


def run_case(model, name, cost, mode, dist, dp, per_rank, cap, seed) -> dict:
    lengths = generate_lengths(dp * per_rank, dist, seed=seed)
    with_start, ms_with = schedule(lengths, dp, cap, cost, mode, True)
    without, ms_without = schedule(lengths, dp, cap, cost, mode, False)
    base = baseline_microbatches(lengths, dp_size=dp, max_tokens_per_microbatch=cap,
                                 sample_flops=sequence_fwd_flops(lengths, model.spec))
    base_ms = evaluate_schedule(base, lengths, max_tokens_per_microbatch=cap, cost=cost,
                                mode=mode).makespan
    return {"cost": name, "dist": dist, "dp": dp, "samples_per_rank": per_rank, "cap": cap,
            "seed": seed, "makespan": with_start.makespan, "makespan_without": without.makespan,
            "baseline_makespan": base_ms, "wall_ms": ms_with, "wall_ms_without": ms_without}


def summary(rows: list[dict]) -> dict:
    gain = np.array([1 - r["makespan"] / r["makespan_without"] for r in rows])
    ratio = np.array([r["wall_ms"] / r["wall_ms_without"] for r in rows])
    added = np.array([r["wall_ms"] - r["wall_ms_without"] for r in rows])
    return {
        "batches": len(rows), "shorter": int((gain > 0).sum()), "longer": int((gain < 0).sum()),
        "mean_gain": float(gain.mean()), "max_gain": float(gain.max()),
        "baseline_shorter_with": sum(r["baseline_makespan"] < r["makespan"] for r in rows),
        "baseline_shorter_without": sum(r["baseline_makespan"] < r["makespan_without"]
                                        for r in rows),
        "time_ratio_median": float(np.median(ratio)),
        "time_ratio_p90": float(np.percentile(ratio, 90)), "time_ratio_max": float(ratio.max()),
        "added_ms_max": float(added.max()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="dp 8 and 64, one cap, one seed")
    p.add_argument("--json", metavar="PATH", help="also write every case as JSON")
    args = p.parse_args(argv)
    logging.disable(logging.WARNING)  # samples over the 8k cap: one warning per batch
    dps, caps, seeds = ((8, 64), (16384,), (0,)) if args.quick else (DPS, CAPS, SEEDS)
    model = load_cost_model(PROFILE)
    print(f"{model.label}; rl and bimodal lengths, dp {list(dps)}, {list(PER_RANK)} samples a "
          f"rank, caps {list(caps)}, seeds {list(seeds)}; gain = makespan without the split "
          "start over with it, - 1")
    print(f"{'cost':<12} {'batches':>7} {'shorter':>7} {'longer':>6} {'mean gain':>9} "
          f"{'max gain':>8} {'baseline wins: with':>19} {'without':>7} "
          f"{'time ratio median/p90/max':>25} {'+ms max':>7}")
    rows, summaries = [], {}
    for name, (cost, mode) in costs(model).items():
        mine = [run_case(model, name, cost, mode, dist, dp, per_rank, cap, seed)
                for dist in ("rl", "bimodal") for dp in dps for per_rank in PER_RANK
                for cap in caps for seed in seeds]
        rows += mine
        s = summaries[name] = summary(mine)
        print(f"{name:<12} {s['batches']:>7} {s['shorter']:>7} {s['longer']:>6} "
              f"{s['mean_gain']:>9.2%} {s['max_gain']:>8.2%} {s['baseline_shorter_with']:>19} "
              f"{s['baseline_shorter_without']:>7} {s['time_ratio_median']:>11.2f} /"
              f"{s['time_ratio_p90']:>5.2f} /{s['time_ratio_max']:>5.2f} "
              f"{s['added_ms_max']:>7.1f}")
    if args.json:
        write_cases(args.json, rows, cost_model=PROFILE, label=model.label, quick=args.quick,
                    summary=summaries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
