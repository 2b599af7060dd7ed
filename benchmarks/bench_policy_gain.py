"""Predicted gain of cost-model balance over token and FLOPs balance, by samples per rank.

    PYTHONPATH=. python benchmarks/bench_policy_gain.py [--cost-model h200/qwen3-8b]
        [--json benchmarks/results/bench_policy_gain_h200.json]

What bench-schedule measures on a GPU for one batch size, predicted here on the CPU for
many: for dp ∈ {8, 16, 64}, 16-128 RL-like samples per rank (`generate_lengths("rl")`),
caps 16k and 32k and three seeds, each batch is scheduled by this scheduler balancing
tokens, analytic FLOPs and the cost model, and every schedule is judged by the cost model
(`evaluate_schedule`). Reported: the cost-model policy's makespan below each other
policy's, min-max over seeds and caps. Token balance gets closer to the mean as ranks hold
more samples, so the gain over it shrinks with the batch: the issue's "10% below token
balance" target depends on the batch, and this shows where it is reachable at all.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from costmodel.model import load_cost_model  # noqa: E402
from costmodel.scheduler import build_schedule, evaluate_schedule, generate_lengths  # noqa: E402

DPS = (8, 16, 64)
PER_RANK = (16, 32, 64, 128)
CAPS = (16384, 32768)
SEEDS = (0, 1, 2)
POLICIES = ("tokens", "flops")  # compared with the cost model's own


def gains(model, dp: int, per_rank: int, cap: int, seed: int) -> dict[str, float]:
    """The cost-model policy's makespan below each of POLICIES' (a fraction), for one batch."""
    lengths = generate_lengths(dp * per_rank, "rl", seed=seed)
    spec = model.spec

    def makespan(cost) -> float:
        s = build_schedule(lengths, dp_size=dp, max_tokens_per_microbatch=cap, cost=cost,
                           spec=spec)
        return evaluate_schedule(s.microbatches, lengths, max_tokens_per_microbatch=cap,
                                 cost=model, spec=spec).makespan

    ours = makespan(model)
    return {p: 1.0 - ours / makespan(p) for p in POLICIES}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cost-model", default="h200/qwen3-8b", help="judge and cost-model policy")
    p.add_argument("--json", metavar="PATH", help="also write the table as JSON")
    args = p.parse_args(argv)
    model = load_cost_model(args.cost_model)
    rows = []
    print(f"cost model {args.cost_model}: {model.label}; rl lengths, caps {list(CAPS)}, "
          f"seeds {list(SEEDS)}; gain = cost-model policy's makespan below the other's")
    print(f"{'dp':>3} {'samples/rank':>12} " + " ".join(f"{'vs ' + p:>16}" for p in POLICIES))
    for dp in DPS:
        for per_rank in PER_RANK:
            cases = [{"cap": cap, "seed": seed, **gains(model, dp, per_rank, cap, seed)}
                     for cap in CAPS for seed in SEEDS]
            row = {"dp": dp, "samples_per_rank": per_rank, "cases": cases}
            for policy in POLICIES:
                values = [c[policy] for c in cases]
                row[f"min_vs_{policy}"], row[f"max_vs_{policy}"] = min(values), max(values)
            rows.append(row)
            print(f"{dp:>3} {per_rank:>12} " + " ".join(
                f"{row[f'min_vs_{p}']:>7.1%}..{row[f'max_vs_{p}']:>6.1%}" for p in POLICIES))
    if args.json:
        doc = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
               "machine": f"{platform.machine()}, Python {platform.python_version()}, "
                          f"numpy {np.__version__} (predictions: no timing)",
               "cost_model": args.cost_model, "label": model.label, "caps": list(CAPS),
               "seeds": list(SEEDS), "distribution": "rl", "rows": rows}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
