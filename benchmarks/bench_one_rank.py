"""One rank's micro-batches, as verl asks for them (`rearrange_micro_batches` per rank).

    PYTHONPATH=. python benchmarks/bench_one_rank.py [--quick] [--json out.json]

For each batch (rl and bimodal lengths, and ``at-limit``: rl responses clipped at a length
limit of half the cap, as when many hit it), three splits into micro-batches of at most
``cap`` tokens:

- ``verl``: verl's own rule, re-implemented: ``min(n, ceil(Σ L / cap))`` micro-batches,
  Karmarkar-Karp over its workload ``24576·L + L²`` (it ignores the cap, so some can be
  over it);
- ``ffd``: first-fit decreasing by tokens, the classic bin-packing count, for reference;
- ``ours``: `costmodel.integrations.verl.balanced_micro_batches` with verl's default cost
  (what the drop-in does unless told otherwise), and ``ours+model`` with the shipped H200
  Qwen3-8B profile as its cost; both timed (best of three, one process).

Each split is priced with that profile (a fixed cost per micro-batch and per-token rates
that depend on the fill): the rank's predicted step time. verl's split is priced too,
though micro-batches over the cap are ones a GPU may not have the memory for.
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
from costmodel.integrations.verl import balanced_micro_batches  # noqa: E402
from costmodel.model import load_cost_model  # noqa: E402
from costmodel.scheduler import generate_lengths, karmarkar_karp  # noqa: E402
from costmodel.scheduler.baselines import first_fit_pack  # noqa: E402

SIZES = (64, 256, 1024, 4096, 16384)
CAP = 16384
DISTS = ("rl", "bimodal", "at-limit")


def batch(dist: str, n: int, seed: int) -> np.ndarray:
    if dist == "at-limit":
        return np.minimum(generate_lengths(n, "rl", seed=seed), CAP // 2)
    return generate_lengths(n, dist, seed=seed)


def verl_split(lengths: np.ndarray, cap: int) -> list[list[int]]:
    """verl's rearrange_micro_batches rule (its count, its workload, Karmarkar-Karp).

    Plain Karmarkar-Karp, as verl runs it: not the drop-in `get_seqlen_balanced_partitions`,
    which swaps items between heavy and light sets afterwards.
    """
    count = min(lengths.size, -(-int(lengths.sum()) // cap))
    workload = (24576 * lengths + lengths.astype(np.int64) ** 2).tolist()
    return karmarkar_karp(workload, count, equal_size=False)


def ffd_count(lengths: np.ndarray, cap: int) -> int:
    """Micro-batches of first-fit decreasing: first fit, longest samples first."""
    return len(first_fit_pack(sorted(lengths.tolist(), reverse=True), cap))


def summary(split: list[list[int]], lengths: np.ndarray, cap: int, model) -> dict:
    tokens = [int(lengths[mb].sum()) for mb in split]
    step_ms = sum(model.microbatch_cost(lengths[mb]) for mb in split)
    return dict(micro_batches=len(split), over_cap=sum(t > cap for t in tokens),
                step_ms=float(step_ms))


def run(sizes, dists, repeats: int) -> list[dict]:
    model = load_cost_model("h200/qwen3-8b")
    print(f"{'dist':9} {'n':>5} | {'verl: mbs':>9} {'over':>4} {'step ms':>8} | {'ffd':>4} | "
          f"{'ours: mbs':>9} {'step ms':>8} {'wall ms':>7} | {'+model: mbs':>11} "
          f"{'step ms':>8} {'wall ms':>7}")
    rows = []
    for dist in dists:
        for n in sizes:
            lengths = batch(dist, n, seed=n)
            row = dict(dist=dist, n=n, cap=CAP, ffd_micro_batches=ffd_count(lengths, CAP),
                       verl=summary(verl_split(lengths, CAP), lengths, CAP, model))
            for name, cost in (("ours", None), ("ours+model", model)):
                ms, (split, _) = best_time(
                    functools.partial(balanced_micro_batches, lengths, CAP, cost=cost), repeats)
                row[name] = dict(summary(split, lengths, CAP, model), wall_ms=ms)
            rows.append(row)
            v, o, m = row["verl"], row["ours"], row["ours+model"]
            print(f"{dist:9} {n:5} | {v['micro_batches']:9} {v['over_cap']:4} "
                  f"{v['step_ms']:8.0f} | {row['ffd_micro_batches']:4} | {o['micro_batches']:9} "
                  f"{o['step_ms']:8.0f} {o['wall_ms']:7.1f} | {m['micro_batches']:11} "
                  f"{m['step_ms']:8.0f} {m['wall_ms']:7.1f}")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the two smallest sizes, timed once")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    sizes, repeats = (SIZES[:2], 1) if args.quick else (SIZES, 3)
    logging.disable(logging.WARNING)
    try:
        rows = run(sizes, DISTS, repeats)
    finally:
        logging.disable(logging.NOTSET)  # main() may run inside a test session
    if args.json:
        write_cases(args.json, rows, priced_by="h200/qwen3-8b", cap=CAP)
    return 0


if __name__ == "__main__":
    sys.exit(main())
