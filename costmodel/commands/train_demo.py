"""`costmodel train-demo`: the reference data-parallel trainer on local processes.

    costmodel train-demo --nproc 2 --steps 8 --balance-by-flops [--cost-model FILE]

Same trainer and flags as `torchrun ... examples/train_varlen.py`, launched with
torch.multiprocessing (gloo on CPU, nccl on GPUs), so it runs anywhere torch does.
"""

from __future__ import annotations

import argparse
import json

import numpy as np


def register(subparsers: argparse._SubParsersAction) -> None:
    from costmodel.training.config import add_trainer_arguments

    parser = subparsers.add_parser(
        "train-demo",
        help="train a tiny GPT data-parallel on local processes with the balancing flags",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--nproc", type=int, default=2, help="data-parallel processes to launch (default: 2)"
    )
    parser.add_argument("--json", action="store_true", help="print the step records as JSON")
    add_trainer_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from costmodel.training.launch import launch

    records = launch(args, args.nproc)
    if args.json:
        print(json.dumps(records, indent=1))
        return 0
    print(
        f"{'step':>4} {'loss':>8} {'tokens':>7} {'mb/rank':>7}  "
        f"{'max/mean pred':>13} {'max/mean meas':>13}  compute ms per rank"
    )
    for r in records:
        times = " ".join(f"{t:.1f}" for t in r["compute_ms"])
        print(
            f"{r['step'] + 1:>4} {r['loss']:>8.4f} {r['tokens']:>7} {r['microbatches_per_rank']:>7}  "
            f"{r['predicted_imbalance']:>13.3f} {r['measured_imbalance']:>13.3f}  {times}"
        )
    if records:
        print(
            f"balanced by {records[0]['cost']} over {len(records[0]['compute_ms'])} ranks: loss "
            f"{records[0]['loss']:.4f} -> {records[-1]['loss']:.4f}; schedules agreed on every "
            f"step; mean max/mean predicted "
            f"{np.mean([r['predicted_imbalance'] for r in records]):.3f}, measured "
            f"{np.mean([r['measured_imbalance'] for r in records]):.3f}"
        )
    return 0
