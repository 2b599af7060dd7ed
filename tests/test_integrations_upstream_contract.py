"""The drop-ins against the contracts of the upstream functions they stand in for.

Each test states what the upstream function promises (read, not copied, from the file
named) and checks the drop-in keeps it on the same inputs:

- verl-project/verl verl/utils/seqlen_balancing.py at 0db13434 and dde90e7d (and the
  ``force_group_size`` version that verl/workers/engine/utils.py at 05a1edd6 calls);
  tests/utils/test_seqlen_balancing.py at 015c0eaa;
- THUDM/slime slime/utils/dp_schedule.py at 04e67434 (``global_batch_size`` +
  ``rollout_indices``) and b1de73ca (``step_sample_indices``); tests/test_dp_schedule.py at
  04e67434; radixark/miles miles/utils/dp_schedule.py (``allow_partial_train_step``).
"""

from __future__ import annotations

from itertools import chain
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from costmodel.integrations import args as cm_args  # noqa: E402
from costmodel.integrations import slime as cm_slime  # noqa: E402
from costmodel.integrations import verl as cm_verl  # noqa: E402


@pytest.fixture(autouse=True)
def _keep_warn_once_state():
    """The drop-ins warn once per process; what these tests trigger is forgotten after
    them, so that other modules' tests still see their first warning."""
    before = set(cm_args._warned)
    yield
    cm_args._warned.intersection_update(before)


def _workload(length: int) -> int:
    """verl's calculate_workload for one sequence: 24576·L + L²."""
    return 24576 * length + length * length


def _padded_batch(lengths, width=None, left_pad=False):
    width = width or max(lengths)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        if left_pad:
            mask[i, width - n:] = 1
        else:
            mask[i, :n] = 1
    ids = torch.arange(len(lengths) * width).reshape(len(lengths), width)
    return {"input_ids": ids, "attention_mask": mask}


def _verl_pipeline_order(parts, weights):
    """verl's run order for its partitions: by summed workload, heaviest first (ties by
    first index, descending), then the even places reversed followed by the odd ones."""
    order = sorted(range(len(parts)), key=lambda j: (weights[j], parts[j][0]), reverse=True)
    return order[::2][::-1] + order[1::2]


# --------------------------------------------------------------------------- verl


@pytest.mark.parametrize("equal_size", [True, False])
def test_balanced_partitions_keep_verls_contract_on_its_workload_tensor(equal_size):
    """verl's trainers pass ``calculate_workload(lengths)`` (a list, or a float32 tensor in
    newer trainers) and index the result back into it: k lists, each sorted, none empty,
    every index once, and with ``equal_size`` the same count in each."""
    rng = np.random.default_rng(3)
    lengths = torch.tensor(rng.integers(100, 8000, size=96), dtype=torch.float32)
    workloads = 24576 * lengths + lengths**2
    parts = cm_verl.get_seqlen_balanced_partitions(workloads, k_partitions=8, equal_size=equal_size)
    assert len(parts) == 8
    assert all(p and p == sorted(p) for p in parts)
    assert sorted(chain.from_iterable(parts)) == list(range(96))
    assert all(type(i) is int for i in chain.from_iterable(parts))
    if equal_size:
        assert {len(p) for p in parts} == {12}
    # the caller's own follow-up (newer trainers sort each partition by its workload)
    for p in parts:
        p.sort(key=lambda i: (float(workloads[i]), i))


def test_rearrange_round_trips_as_verls_own_test():
    """verl's test_seqlen_balancing: 20 rows of 100 with left padding and a 300-token cap;
    concatenating the micro-batches and indexing by get_reverse_idx of the flattened
    indices gives the batch back."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(50, 91, size=20).tolist()
    batch = _padded_batch(lengths, width=100, left_pad=True)
    micro_batches, idx = cm_verl.rearrange_micro_batches(batch, max_token_len=300)
    reverse = torch.tensor(cm_verl.get_reverse_idx(list(chain.from_iterable(idx))))
    for key in ("input_ids", "attention_mask"):
        joined = torch.cat([mb[key] for mb in micro_batches])
        torch.testing.assert_close(joined[reverse], batch[key])


def test_rearrange_indices_sorted_in_each_micro_batch_and_verls_run_order():
    """Upstream: each micro-batch's indices ascending (get_seqlen_balanced_partitions sorts
    them); with use_dynamic_bsz_balance the micro-batches in verl's pipeline order of their
    summed workload."""
    rng = np.random.default_rng(1)
    lengths = rng.integers(50, 4000, size=64).tolist()
    batch = _padded_batch(lengths, width=4000)
    for balance in (True, False):
        _, idx = cm_verl.rearrange_micro_batches(batch, max_token_len=16384,
                                                 same_micro_num_in_dp=False,
                                                 use_dynamic_bsz_balance=balance)
        assert all(p == sorted(p) for p in idx)
        assert sorted(chain.from_iterable(idx)) == list(range(64))
        assert all(sum(lengths[i] for i in p) <= 16384 for p in idx)
        if balance:
            weights = [sum(_workload(lengths[i]) for i in p) for p in idx]
            assert _verl_pipeline_order(idx, weights) == list(range(len(idx)))


def test_force_group_size_rows_stay_contiguous_and_ascending():
    """Upstream (force_group_size): the batch a multiple of the group size; each group's
    rows together, in order, and each micro-batch's rows ascending."""
    rng = np.random.default_rng(2)
    lengths = rng.integers(50, 3000, size=48).tolist()
    batch = _padded_batch(lengths, width=3000)
    _, idx = cm_verl.rearrange_micro_batches(batch, max_token_len=12000,
                                             same_micro_num_in_dp=False, force_group_size=4)
    for p in idx:
        assert p == sorted(p) and len(p) % 4 == 0
        assert all(p[k] % 4 == 0 and p[k:k + 4] == list(range(p[k], p[k] + 4))
                   for k in range(0, len(p), 4))
    assert sorted(chain.from_iterable(idx)) == list(range(48))
    with pytest.raises(ValueError, match="multiple of force_group_size"):
        cm_verl.rearrange_micro_batches(_padded_batch([5] * 6), max_token_len=100,
                                        same_micro_num_in_dp=False, force_group_size=4)


@pytest.mark.parametrize("minimum, divided_by, expected", [
    (3, None, 3), (7, None, 7), (10, None, 10), (3, 2, 4), (None, 4, 4),
])
def test_min_count_and_divisor_give_verls_count_when_the_cap_is_loose(minimum, divided_by,
                                                                      expected):
    """Upstream: max(min_num_micro_batch, ceil(Σ L / cap)) rounded up to a multiple of
    num_batches_divided_by; with a loose cap that is the count exactly."""
    batch = _padded_batch([20] * 10)
    _, idx = cm_verl.rearrange_micro_batches(batch, max_token_len=1000,
                                             min_num_micro_batch=minimum,
                                             num_batches_divided_by=divided_by,
                                             same_micro_num_in_dp=False)
    assert len(idx) == expected


def test_max_token_len_as_verls_engine_computes_it():
    """verl's engine passes ``data["max_token_len_per_gpu"] * sp_size``: a 0-d tensor."""
    batch = _padded_batch([20] * 6)
    _, idx = cm_verl.rearrange_micro_batches(batch, max_token_len=torch.tensor(30) * 2,
                                             same_micro_num_in_dp=False)
    assert all(sum(20 for _ in p) <= 60 for p in idx) and len(idx) == 2


def test_group_partitions_keep_verls_contract():
    """Upstream: k lists of sample indices, each sorted, a uid's samples in one list, the
    same number of uids in each (Karmarkar-Karp with equal sizes over uid groups)."""
    rng = np.random.default_rng(4)
    n = 8
    uids = [u for u in range(16) for _ in range(n)]
    lengths = rng.integers(100, 6000, size=len(uids)).tolist()
    parts = cm_verl.get_group_balanced_partitions(lengths, uids, k_partitions=4)
    assert len(parts) == 4 and all(p == sorted(p) for p in parts)
    assert sorted(chain.from_iterable(parts)) == list(range(len(uids)))
    for p in parts:
        held = {uids[i] for i in p}
        assert len(held) == 4
        assert sum(1 for u in uids if u in held) == len(p)


# --------------------------------------------------------------------------- slime


def _tp(dp=1, cp=1, vpp=1, group=1):
    return {"dp_size": dp, "cp_size": cp, "vpp_size": vpp,
            "microbatch_group_size_per_vp_stage": group}


def _args(**kw):
    base = dict(micro_batch_size=1, use_dynamic_batch_size=False, max_tokens_per_gpu=None,
                balance_data=False)
    base.update(kw)
    return SimpleNamespace(**base)


def _assert_slime_invariants(out, *, dp, expected, lengths, cap=None):
    """slime's dp_schedule invariants: the same count per step on every rank, each rank's
    micro_batch_indices tiling range(len(partition)), ranks disjoint and covering the kept
    samples, every micro-batch under the cap unless a single oversized sample."""
    partitions, mbi, nmb, _ = out
    seen: set[int] = set()
    for r in range(dp):
        assert len(mbi[r]) == sum(nmb)
        assert list(chain.from_iterable(mbi[r])) == list(range(len(partitions[r])))
        assert seen.isdisjoint(partitions[r])
        seen.update(partitions[r])
        if cap is not None:
            for mb in mbi[r]:
                total = sum(lengths[partitions[r][i]] for i in mb)
                assert total <= cap or len(mb) == 1
    assert seen == set(expected)


@pytest.mark.parametrize("balance", [False, True])
def test_slime_oversized_sample_lands_alone(balance):
    lengths = [15, 3, 3, 3, 3, 3, 3, 3]
    args = _args(use_dynamic_batch_size=True, max_tokens_per_gpu=10, balance_data=balance)
    out = cm_slime.build_dp_schedule(args, _tp(dp=2), lengths, global_batch_size=8,
                                     rollout_indices=list(range(8)))
    _assert_slime_invariants(out, dp=2, expected=range(8), lengths=lengths, cap=10)


@pytest.mark.parametrize("balance", [False, True])
def test_slime_vpp_rounds_each_ranks_count_to_the_group(balance):
    lengths = [4] * 32
    args = _args(use_dynamic_batch_size=True, max_tokens_per_gpu=8, balance_data=balance)
    out = cm_slime.build_dp_schedule(args, _tp(dp=2, vpp=2, group=2), lengths,
                                     global_batch_size=16, rollout_indices=list(range(32)))
    assert all(n % 2 == 0 for n in out[2]) and out[3] == [16, 16]
    _assert_slime_invariants(out, dp=2, expected=range(32), lengths=lengths, cap=8)


def test_slime_rollouts_stay_in_one_step_and_trailing_ones_are_dropped():
    lengths = [3] * 8
    args = _args(use_dynamic_batch_size=True, max_tokens_per_gpu=12)
    out = cm_slime.build_dp_schedule(args, _tp(), lengths, global_batch_size=2,
                                     rollout_indices=[0, 0, 1, 2, 2, 3, 4, 4])
    assert out[3] == [2, 2]
    _assert_slime_invariants(out, dp=1, expected=range(6), lengths=lengths, cap=12)


def test_slime_forks_partial_final_step():
    """radixark/miles' --allow-partial-train-step (dynamic batch size only): the trailing
    rollouts train as one smaller final step, kept only with at least dp_size samples."""
    lengths = [3] * 8
    rollouts = [0, 0, 1, 2, 2, 3, 4, 4]
    args = _args(use_dynamic_batch_size=True, max_tokens_per_gpu=12,
                 allow_partial_train_step=True)
    out = cm_slime.build_dp_schedule(args, _tp(), lengths, global_batch_size=2,
                                     rollout_indices=rollouts)
    assert out[3] == [2, 2, 1] and len(out[2]) == 3
    _assert_slime_invariants(out, dp=1, expected=range(8), lengths=lengths, cap=12)
    # the last rollout's 1 sample is fewer than dp_size=2: skipped
    out = cm_slime.build_dp_schedule(args, _tp(dp=2), [3] * 5, global_batch_size=2,
                                     rollout_indices=[0, 0, 1, 1, 2])
    assert out[3] == [2]
    # fixed-size micro-batches: the flag does nothing, as there
    static = _args(micro_batch_size=1, allow_partial_train_step=True)
    out = cm_slime.build_dp_schedule(static, _tp(), lengths, global_batch_size=2,
                                     rollout_indices=rollouts)
    assert out[3] == [2, 2]


def test_slime_step_sample_indices_form():
    """b1de73ca: each step's sample count is its global_batch_sizes entry."""
    lengths = [5, 5, 5, 5, 6, 6, 6]
    args = _args(use_dynamic_batch_size=True, max_tokens_per_gpu=10, balance_data=True)
    out = cm_slime.build_dp_schedule(args, _tp(dp=2), lengths,
                                     step_sample_indices=[[0, 1, 2], [3, 4, 5, 6]])
    assert out[3] == [3, 4]
    _assert_slime_invariants(out, dp=2, expected=range(7), lengths=lengths, cap=10)


def test_slime_packing_safety_margin_plans_more_micro_batches():
    for balance in (False, True):
        args = _args(use_dynamic_batch_size=True, max_tokens_per_gpu=12,
                     packing_safety_margin=0.5, balance_data=balance)
        out = cm_slime.build_dp_schedule(args, _tp(), [6, 6, 6, 6], global_batch_size=4,
                                         rollout_indices=[0, 1, 2, 3])
        assert out[2] == [4]
