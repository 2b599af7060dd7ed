"""verl's DP balancing with whole prompts per rank (PrefixGrouper), against the drop-in.

    PYTHONPATH=. python benchmarks/bench_group_partitions.py [--cost-model h200/qwen3-8b]
        [--cap 16384] [--json benchmarks/results/bench_group_partitions.json]

For RL-like and bimodal batches of prompts with 8-16 responses each over 8-1,024 ranks,
three ways to give every rank the same number of prompts:

- ``verl``: Karmarkar-Karp with equal sizes over the prompts' summed ``24576·L + L²``
  (verl's `get_group_balanced_partitions`; this package's implementation of the method);
- ``drop-in``: `costmodel.integrations.verl.get_group_balanced_partitions` as verl calls it
  (the same proxy, then swaps, `costmodel.scheduler.set_swaps`);
- ``model prices``: the drop-in's method on the cost model's per-sample prices instead of
  the proxy (what each sample adds to a micro-batch filled to the cap): why the drop-in
  takes no cost.

Each partition is judged by the cost model the way a step runs it: every rank's samples
packed under the cap by `build_schedule` (dp 1, as verl's per-rank micro-batching follows),
the rank's time the sum of its micro-batches' costs. Reported: the step (the slowest rank)
against verl's, the slowest rank over the mean, and each partition call's wall time (best of
three, one process) against verl's.
"""

from __future__ import annotations

import argparse
import functools
import logging
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_scheduler import best_time, write_cases  # noqa: E402
from costmodel.integrations.verl import VERL_WORKLOAD, get_group_balanced_partitions  # noqa: E402
from costmodel.model import load_cost_model  # noqa: E402
from costmodel.scheduler import build_schedule, generate_lengths  # noqa: E402
from costmodel.scheduler.costs import ModelCost  # noqa: E402
from costmodel.scheduler.partition import karmarkar_karp_labels  # noqa: E402
from costmodel.scheduler.set_swaps import karmarkar_karp_then_swaps  # noqa: E402
from costmodel.scheduler.sorting import as_lists, members_of  # noqa: E402

# (prompts, responses per prompt, dp): 8 prompts a rank (64 or 128 samples).
CASES = (
    (64, 8, 8),
    (128, 16, 16),
    (512, 8, 64),
    (2048, 8, 256),
    (8192, 8, 1024),
)


def verl_partitions(lengths: np.ndarray, prompt: np.ndarray, dp: int) -> list[list[int]]:
    """verl's method: Karmarkar-Karp with equal sizes over each prompt's summed proxy."""
    work = np.bincount(prompt, weights=VERL_WORKLOAD.sample_costs(lengths))
    return as_lists(*members_of(karmarkar_karp_labels(work, dp, equal_size=True)[prompt], dp))


def swapped_partitions(prices: np.ndarray, prompt: np.ndarray, dp: int) -> list[list[int]]:
    """The drop-in's method on other per-sample prices."""
    per_prompt = np.bincount(prompt, weights=prices)
    labels = karmarkar_karp_then_swaps(per_prompt, dp)
    return as_lists(*members_of(labels[prompt], dp))


def rank_times(parts: list[list[int]], lengths: np.ndarray, model, cap: int) -> np.ndarray:
    """Each rank's predicted time: its samples packed under the cap, micro-batch costs summed."""
    out = []
    for part in parts:
        s = build_schedule(lengths[part], dp_size=1, max_tokens_per_microbatch=cap, cost=model,
                           spec=model.spec)
        out.append(s.makespan)
    return np.array(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cost-model", default="h200/qwen3-8b", help="the judge, and what the "
                   "drop-in balances in its third column")
    p.add_argument("--cap", type=int, default=16384, help="tokens per micro-batch")
    p.add_argument("--json", metavar="PATH", help="also write the table as JSON")
    args = p.parse_args(argv)
    model = load_cost_model(args.cost_model)
    logging.disable(logging.WARNING)  # the profile's "other software" note, once
    print(f"judge: {model.label}; cap {args.cap}")
    print(f"{'dist':8} {'prompts':>7} {'n':>5} {'dp':>5} | {'policy':15} {'step / verl':>11} "
          f"{'max/mean':>8} {'ms':>7} {'ms / verl':>9}")
    rows = []
    for dist in ("rl", "bimodal"):
        for prompts, per, dp in CASES:
            n = prompts * per
            lengths = generate_lengths(n, dist, seed=n + dp)
            prompt = np.arange(n) // per
            calls = {
                "verl": functools.partial(verl_partitions, lengths, prompt, dp),
                "drop-in": functools.partial(get_group_balanced_partitions, lengths, prompt, dp),
                "model prices": functools.partial(
                    swapped_partitions, ModelCost(model).marginal_costs(lengths, args.cap),
                    prompt, dp),
            }
            base_step = base_ms = 0.0  # verl's, the first of the calls
            for name, call in calls.items():
                ms, parts = best_time(call, 3)
                times = rank_times(parts, lengths, model, args.cap)
                step = float(times.max())
                if name == "verl":
                    base_step, base_ms = step, ms
                row = dict(dist=dist, prompts=prompts, responses_per_prompt=per, n=n, dp=dp,
                           policy=name, step_ms=step, step_over_verl=step / base_step,
                           max_over_mean=step / float(times.mean()), wall_ms=ms,
                           wall_over_verl=ms / base_ms)
                rows.append(row)
                print(f"{dist:8} {prompts:7} {n:5} {dp:5} | {name:15} "
                      f"{row['step_over_verl']:11.4f} {row['max_over_mean']:8.4f} {ms:7.1f} "
                      f"{row['wall_over_verl']:9.2f}")
    if args.json:
        write_cases(args.json, rows, judge=model.label, cap=args.cap)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
