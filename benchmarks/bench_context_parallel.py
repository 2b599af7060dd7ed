"""Predicted cost of ignoring context parallelism when balancing by a cost model.

    PYTHONPATH=. python benchmarks/bench_context_parallel.py [--cost-model h200/qwen3-8b]
        [--json benchmarks/results/bench_context_parallel_h200.json]

With context parallelism of size cp, a micro-batch of up to cp x the per-GPU cap is split
over cp GPUs. The baseline prices it as one GPU running the whole micro-batch (what
`scheduler_from_args` did before `CostModel.for_context_parallel`); the other prices what
one of the cp GPUs runs. For cp in {2, 4, 8}, rl and bimodal lengths (1024 samples, dp 16,
per-GPU cap 8k, 4k at cp 8) and five seeds, both schedules are judged by the per-GPU
pricing (`evaluate_schedule`). Reported: the baseline's makespan above the per-GPU one's,
mean and min-max over seeds, and the micro-batches per rank of each. Predictions under the
cost model, on the CPU: no GPU time is measured here.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_scheduler import write_cases  # noqa: E402
from costmodel.model import load_cost_model  # noqa: E402
from costmodel.scheduler import build_schedule, evaluate_schedule, generate_lengths  # noqa: E402

CASES = ((2, 8192), (4, 8192), (8, 4096))  # (cp, per-GPU cap)
DISTS = ("rl", "bimodal")
SEEDS = (0, 1, 2, 3, 4)
N, DP = 1024, 16


def one_batch(model, cp: int, cap: int, dist: str, seed: int) -> dict[str, float]:
    """The one-GPU pricing's makespan over the per-GPU one's, and both micro-batch counts."""
    lengths = np.minimum(generate_lengths(N, dist, seed=seed), cap)  # none alone over the cap
    per_gpu = model.for_context_parallel(cp)

    def schedule(cost):
        s = build_schedule(lengths, dp_size=DP, max_tokens_per_microbatch=cap, cost=cost,
                           spec=model.spec)
        judged = evaluate_schedule(s.microbatches, lengths, max_tokens_per_microbatch=cap,
                                   cost=per_gpu, spec=model.spec)
        return judged.makespan, s.num_microbatches

    baseline, baseline_m = schedule(model)
    ours, ours_m = schedule(per_gpu)
    return {"excess": baseline / ours - 1.0, "microbatches_one_gpu": baseline_m,
            "microbatches_per_gpu": ours_m}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cost-model", default="h200/qwen3-8b", help="the cost model to price by")
    p.add_argument("--json", metavar="PATH", help="also write the table as JSON")
    args = p.parse_args(argv)
    model = load_cost_model(args.cost_model)
    print(f"cost model {args.cost_model}: {model.label}; {N} samples, dp {DP}, seeds "
          f"{list(SEEDS)}; excess = makespan of the one-GPU pricing's schedule over the "
          "per-GPU pricing's, both judged per GPU")
    print(f"{'cp':>3} {'cap':>7} {'lengths':>8} {'mean excess':>12} {'min..max':>16} "
          f"{'mb/rank one GPU':>16} {'per GPU':>8}")
    rows = []
    for cp, per_gpu_cap in CASES:
        cap = cp * per_gpu_cap
        for dist in DISTS:
            cases = [{"seed": seed, **one_batch(model, cp, cap, dist, seed)} for seed in SEEDS]
            excess = [c["excess"] for c in cases]
            row = {"cp": cp, "cap": cap, "distribution": dist, "cases": cases,
                   "mean_excess": float(np.mean(excess)), "min_excess": min(excess),
                   "max_excess": max(excess)}
            rows.append(row)
            counts = sorted({c["microbatches_one_gpu"] for c in cases})
            ours = sorted({c["microbatches_per_gpu"] for c in cases})
            print(f"{cp:>3} {cap:>7} {dist:>8} {row['mean_excess']:>+12.2%} "
                  f"{row['min_excess']:>+7.2%}..{row['max_excess']:>+7.2%} "
                  f"{str(counts):>16} {str(ours):>8}")
    if args.json:
        write_cases(args.json, rows, note="predictions: no timing", cost_model=args.cost_model,
                    label=model.label, n=N, dp=DP, seeds=list(SEEDS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
