"""`evaluate_schedule`: cost micro-batches built elsewhere (a baseline, another framework)
under any cost, as a `Schedule`, so schedules compare on equal terms."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from costmodel.flops import as_lengths
from costmodel.scheduler.bounds import lower_bound
from costmodel.scheduler.costs import as_cost
from costmodel.scheduler.schedule import Schedule, token_cap

__all__ = ["evaluate_schedule"]


def evaluate_schedule(
    microbatches: Sequence[Sequence[Sequence[int]]],
    lengths: ArrayLike,
    *,
    max_tokens_per_microbatch: int,
    cost: Any = "tokens",
    spec: Any = None,
    mode: str = "train",
) -> Schedule:
    """A `Schedule` for micro-batches built elsewhere (a baseline, another framework), with
    its predicted costs under ``cost``, so schedules can be compared on equal terms.

    Unlike `build_schedule`, little is guaranteed: ranks may hold different numbers of
    micro-batches and micro-batches may break the cap (`Schedule.cap_violations` counts
    those). But every sample must be in exactly one micro-batch, as indices into
    ``lengths`` (ValueError otherwise): a schedule that drops or repeats samples is not
    comparable.
    """
    lens = as_lengths(lengths, "lengths")
    cap = token_cap(max_tokens_per_microbatch)
    cost_obj = as_cost(cost, spec, mode)
    flat = _members(microbatches, lens.size)
    sizes = [x.size for x in flat]
    idx = np.concatenate(flat) if flat else np.zeros(0, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    costs = cost_obj.evaluate(lens[idx], offsets).tolist()
    tokens = [int(lens[x].sum()) for x in flat]
    starts = np.cumsum([0] + [len(rank) for rank in microbatches]).tolist()
    per_rank = [range(a, b) for a, b in zip(starts[:-1], starts[1:])]  # ids in the order given
    return Schedule.from_microbatches(
        per_rank, [x.tolist() for x in flat], costs, tokens,
        lower_bound=lower_bound(cost_obj, lens, cap, len(microbatches)), cap=cap,
        cost_name=cost_obj.name,
    )


def _members(microbatches: Any, n: int) -> list[np.ndarray]:
    """Each micro-batch's sample indices, sorted, rank by rank; ValueError unless they are
    integers in 0..n-1 and every sample appears exactly once."""
    shape = ("microbatches must be a list of ranks, each a list of micro-batches, each a list "
             "of sample indices")
    if not isinstance(microbatches, (list, tuple)) or not microbatches:
        raise ValueError(f"{shape}; got {type(microbatches).__name__} {microbatches!r:.60}")
    flat = []
    for r, rank in enumerate(microbatches):
        if not isinstance(rank, (list, tuple)):
            raise ValueError(f"{shape}; rank {r} is {type(rank).__name__} {rank!r:.60}")
        for b, mb in enumerate(rank):
            try:
                idx = np.asarray(mb if isinstance(mb, (list, tuple, np.ndarray)) else None)
            except ValueError:  # ragged nesting
                idx = np.asarray(None)
            bools = isinstance(mb, (list, tuple)) and any(isinstance(i, (bool, np.bool_)) for i in mb)
            if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu") or bools:
                raise ValueError(f"{shape}; rank {r} micro-batch {b} is {mb!r:.60}")
            out = idx[(idx < 0) | (idx >= n)]
            if out.size:
                raise ValueError(f"rank {r} micro-batch {b}: sample index {out[0]} is not in "
                                 f"0..{n - 1}")
            flat.append(np.sort(idx.astype(np.int64)))
    counts = np.bincount(np.concatenate(flat) if flat else np.zeros(0, np.int64), minlength=n)
    for bad, what in ((counts > 1, "is in more than one micro-batch"), (counts == 0, "is in none")):
        if bad.any():
            raise ValueError(f"sample {int(np.argmax(bad))} {what}: every sample must be in "
                             f"exactly one micro-batch ({int(bad.sum())} such)")
    return flat
