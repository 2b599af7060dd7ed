"""The verl drop-ins on plain length lists."""

from __future__ import annotations

import numpy as np
import pytest

from costmodel.integrations.verl import (
    get_reverse_idx,
    get_seqlen_balanced_partitions,
    rearrange_micro_batches,
)
from costmodel.scheduler import generate_lengths


def test_balanced_partitions_contract():
    lengths = generate_lengths(64, "rl", seed=0).tolist()
    parts = get_seqlen_balanced_partitions(lengths, 8, equal_size=True)
    assert len(parts) == 8 and all(len(p) == 8 for p in parts)
    assert all(p == sorted(p) for p in parts)
    assert sorted(i for p in parts for i in p) == list(range(64))
    sums = [sum(lengths[i] for i in p) for p in parts]
    assert max(sums) - min(sums) <= max(lengths)
    parts = get_seqlen_balanced_partitions([5, 1, 1, 1, 1, 1], 2, equal_size=False)
    assert all(parts)
    with pytest.raises(ValueError, match=r"number of items \(3\) < k_partitions \(4\)"):
        get_seqlen_balanced_partitions([1, 2, 3], 4, equal_size=False)
    with pytest.raises(ValueError, match="multiple"):
        get_seqlen_balanced_partitions([1, 2, 3], 2, equal_size=True)


def test_rearrange_single_rank():
    lengths = generate_lengths(300, "rl", seed=2)
    cap = 20000
    mbs, rev = rearrange_micro_batches(lengths.tolist(), cap, num_batches_divided_by=4)
    assert len(mbs) % 4 == 0
    flat = [i for mb in mbs for i in mb]
    assert sorted(flat) == list(range(300))
    assert all(lengths[mb].sum() <= cap for mb in mbs)
    assert [flat[j] for j in rev] == list(range(300)), "reverse index inverts the order"
    assert rev == get_reverse_idx(flat)
    # verl's ordering: cheap micro-batches at both ends.
    w = [float((24576 * lengths[mb] + lengths[mb].astype(float) ** 2).sum()) for mb in mbs]
    top = int(np.argmax(w))
    assert w[0] <= w[top] and w[-1] <= w[top]
    more, _ = rearrange_micro_batches(lengths.tolist(), cap, min_num_micro_batch=len(mbs) + 3)
    assert len(more) >= len(mbs) + 3


def test_rearrange_over_dp_ranks():
    lengths = generate_lengths(512, "bimodal", seed=4)
    per_rank, rev = rearrange_micro_batches(
        lengths, 16384, dp_size=4, cost="flops", spec="qwen3-8b"
    )
    assert len(per_rank) == 4 and len({len(r) for r in per_rank}) == 1
    flat = [i for r in per_rank for mb in r for i in mb]
    assert sorted(flat) == list(range(512))
    assert [flat[j] for j in rev] == list(range(512))
    own, _ = rearrange_micro_batches(lengths, 16384, dp_size=4, same_micro_num_in_dp=False)
    assert sorted(i for r in own for mb in r for i in mb) == list(range(512))


def test_rearrange_rejects_a_sequence_over_the_cap():
    with pytest.raises(ValueError, match="over the cap"):
        rearrange_micro_batches([100, 5000, 200], 1000)


def test_balanced_partitions_with_zero_lengths_are_never_empty():
    # verl's contract (every partition non-empty) held only for positive lengths.
    parts = get_seqlen_balanced_partitions([0, 0, 0, 0, 5], 4, equal_size=False)
    assert all(parts) and sorted(i for p in parts for i in p) == [0, 1, 2, 3, 4]
