"""Reference data-parallel trainer: a tiny GPT on RL-like variable-length batches.

    torchrun --nproc_per_node 2 --standalone examples/train_varlen.py \
        --steps 8 --balance-by-flops [--cost-model FILE]

A cost model must be made for this trainer's tiny GPT (its shape is checked); a shipped
profile such as h200/qwen3-8b balances it only with --cost-model-allow-other-shape.

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
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if (_ROOT / "costmodel").is_dir() and str(_ROOT) not in sys.path:  # run from a checkout
    sys.path.insert(0, str(_ROOT))

from costmodel.training.config import add_trainer_arguments  # noqa: E402


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
    except (ValueError, RuntimeError, OSError) as err:
        # Every rank says why it stops: a bad flag fails them all alike, but a failure of
        # one rank alone (out of memory, say) must not go unsaid. OSError, not only
        # FileNotFoundError: an unreadable --lengths-file or --cost-model (PermissionError)
        # was a traceback on every rank, as `costmodel train-demo` says it in one line.
        where = f" (rank {rank})" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""
        print(f"train_varlen.py: error{where}: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    from costmodel.training.trainer import exit_rank

    exit_rank(main())  # not sys.exit: torch's teardown at shutdown can abort a finished rank
