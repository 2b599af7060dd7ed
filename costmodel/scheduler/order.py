"""Run order of the micro-batches inside a rank.

- ``"none"``: the order the packer made them in.
- ``"longest-first"``: costliest first.
- ``"pipeline"``: cheap micro-batches at both ends and the costliest in the middle. With
  pipeline parallelism the first micro-batch fills the pipeline and the last drains it
  while other stages idle, so short ones there shorten the bubbles (verl orders its
  dynamic micro-batches the same way).

Ties are broken by position, so the order is the same in every process.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ORDERS", "run_order", "run_orders"]

ORDERS = ("none", "longest-first", "pipeline")


def run_order(costs: np.ndarray, order: str) -> list[int]:
    """Positions of the micro-batches in execution order (``costs``: one rank's)."""
    return run_orders(np.asarray(costs)[None, :], order)[0].tolist()


def run_orders(costs: np.ndarray, order: str) -> np.ndarray:
    """`run_order` of every row of ``costs`` (ranks x micro-batches) at once: a few numpy
    calls, not a sort per rank (1,024 ranks took ~4 ms in Python calls, ~11 ms piped)."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    ranks, m = costs.shape
    positions = np.broadcast_to(np.arange(m), (ranks, m))
    if order == "none" or m <= 1:
        return positions.copy()
    desc = np.lexsort((positions, -costs))  # per row: costliest first, ties by position
    if order == "longest-first":
        return desc
    # pipeline: c0 >= c1 >= c2 ...  ->  ..., c4, c2, c0, c1, c3, ...
    return np.concatenate([desc[:, ::2][:, ::-1], desc[:, 1::2]], axis=1)
