"""Drop-ins for verl's sequence-length balancing (verl/utils/seqlen_balancing.py), on plain
lists of lengths: no tensors, no torch.distributed.

- `get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size)`: the same
  contract as verl's (k lists of indices, each sorted, none empty; Karmarkar-Karp), with a
  ValueError instead of an assertion on bad input.
- `rearrange_micro_batches(seq_lengths, max_token_len, ...)`: micro-batches for dynamic
  batch size. Where verl splits one rank's batch into ``ceil(Σ L / max_token_len)``
  partitions balanced by a workload proxy (which can exceed the token cap), this packs
  under the cap with `costmodel.scheduler.build_schedule` and balances the chosen cost.
  With ``dp_size > 1`` it takes the whole batch and also chooses which rank runs what, so
  no all-reduce of the micro-batch count is needed: every rank gets the same count.

The default cost is verl's own workload proxy, ``24576·L + L²``; pass ``cost="flops"``
(with ``spec``), a cost model, or a callable to balance something better.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

import numpy as np

from costmodel.scheduler import build_schedule, karmarkar_karp
from costmodel.scheduler.costs import AdditiveCost

__all__ = [
    "VERL_WORKLOAD",
    "get_reverse_idx",
    "get_seqlen_balanced_partitions",
    "rearrange_micro_batches",
]


def _verl_workload(lengths: np.ndarray) -> np.ndarray:
    x = lengths.astype(np.float64)
    return 24576.0 * x + x * x


#: verl's `calculate_workload`: 24576·L + L² (a 7B-shaped FLOPs proxy).
VERL_WORKLOAD = AdditiveCost("verl workload 24576·L + L²", _verl_workload)


def get_seqlen_balanced_partitions(
    seqlen_list: Sequence[int], k_partitions: int, equal_size: bool
) -> list[list[int]]:
    """``k_partitions`` lists of indices with near-equal sums of ``seqlen_list``; indices
    sorted inside each list; none empty. ``equal_size``: the same number of items in each."""
    n = len(seqlen_list)
    if isinstance(k_partitions, bool) or int(k_partitions) < 1:
        raise ValueError(f"k_partitions must be >= 1, got {k_partitions!r}")
    if n < k_partitions:
        raise ValueError(f"number of items ({n}) < k_partitions ({k_partitions})")
    parts = karmarkar_karp(seqlen_list, int(k_partitions), equal_size=equal_size)
    for i, p in enumerate(parts):
        if not p:  # pragma: no cover - KK leaves no set empty when n >= k
            raise ValueError(f"partition {i} is empty")
    return parts


def get_reverse_idx(idx_map: Sequence[int]) -> list[int]:
    """The inverse permutation: ``out[idx_map[i]] = i``."""
    out = [0] * len(idx_map)
    for i, idx in enumerate(idx_map):
        out[idx] = i
    return out


def rearrange_micro_batches(
    seq_lengths: Sequence[int],
    max_token_len: int,
    *,
    dp_size: int = 1,
    same_micro_num_in_dp: bool = True,
    num_batches_divided_by: int | None = None,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    cost: Any = None,
    spec: Any = None,
) -> tuple[list, list[int]]:
    """Micro-batches (index lists) under ``max_token_len``, and the reverse index.

    Args:
        seq_lengths: tokens per sequence (for ``dp_size > 1``: the whole batch).
        max_token_len: token cap of one micro-batch; a longer sequence is an error, as in
            verl.
        dp_size: ranks to spread the batch over.
        same_micro_num_in_dp: every rank runs the same number of micro-batches (always so
            within one call; False lets each rank keep its own fewest).
        num_batches_divided_by: micro-batch count a multiple of this (virtual pipeline).
        min_num_micro_batch: at least this many micro-batches (per rank).
        use_dynamic_bsz_balance: cheap micro-batches at both ends of a rank's run order
            (verl's ordering, for pipeline bubbles); else the order they were packed in.
        cost: what to balance; default verl's workload ``24576·L + L²``.
        spec: model for ``cost="flops"``.

    Returns:
        With ``dp_size == 1``: ``(micro_bsz_idx, reverse_idx)``: lists of indices into
        ``seq_lengths``, in run order, and for every sequence its position in the
        micro-batches laid end to end (verl's `get_reverse_idx` of the flattened order).
        With ``dp_size > 1``: ``(per_rank, reverse_idx)``: ``per_rank[r]`` is rank r's list of
        micro-batches, and ``reverse_idx`` maps every sequence to its position in all
        ranks' micro-batches laid end to end, rank after rank.
    """
    lengths = np.asarray(seq_lengths)
    order = "pipeline" if use_dynamic_bsz_balance else "none"
    kwargs = dict(
        max_tokens_per_microbatch=max_token_len,
        cost=VERL_WORKLOAD if cost is None else cost,
        spec=spec,
        align=num_batches_divided_by or 1,
        order=order,
        strict=True,
        min_num_microbatches=min_num_micro_batch,
    )
    s = build_schedule(lengths, dp_size=dp_size, **kwargs)
    per_rank = s.microbatches
    if dp_size > 1 and not same_micro_num_in_dp:
        # Each rank keeps its own fewest micro-batches for its share of the batch.
        per_rank = []
        for rank_mbs in s.microbatches:
            own = sorted(i for mb in rank_mbs for i in mb)
            again = build_schedule(lengths[own], dp_size=1, **kwargs)
            per_rank.append([[own[i] for i in mb] for mb in again.microbatches[0]])
    if dp_size == 1:
        flat = list(chain.from_iterable(per_rank[0]))
        return per_rank[0], get_reverse_idx(flat)
    flat = list(chain.from_iterable(chain.from_iterable(per_rank)))
    return per_rank, get_reverse_idx(flat)
