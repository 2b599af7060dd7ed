"""Reference data-parallel trainer: a tiny GPT on RL-like variable-length batches.

    torchrun --nproc_per_node 2 --standalone examples/train_varlen.py \
        --steps 8 --balance-by-flops [--cost-model calibrated.json]

CPU runs use gloo, GPU runs nccl. Every rank builds the step's micro-batch schedule on its
own (the flags of `costmodel.integrations.args`), checks that all ranks agree, trains its
micro-batches as packed varlen sequences, and rank 0 logs per-rank compute time, the
predicted and the measured max/mean imbalance, and the loss. `costmodel train-demo` runs
the same trainer without torchrun.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from costmodel.training.config import add_trainer_arguments


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_trainer_arguments(parser)
    args = parser.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"[rank {rank}] %(message)s",
        stream=sys.stdout,
    )
    from costmodel.training.trainer import train

    try:
        train(args)
    except (ValueError, RuntimeError, FileNotFoundError) as err:
        # Every rank validates the same flags, so each would say the same: rank 0 speaks.
        if rank == 0 or "ranks built different schedules" in str(err):
            print(f"train_varlen.py: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
