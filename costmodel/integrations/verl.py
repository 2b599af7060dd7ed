"""Drop-ins for verl's sequence-length balancing (verl/utils/seqlen_balancing.py).

- `get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size)`: the same
  contract as verl's (k lists of indices, each sorted, none empty; Karmarkar-Karp), with a
  ValueError instead of an assertion on bad input, and swaps between heavy and light lists
  after Karmarkar-Karp (`costmodel.scheduler.set_swaps`). verl's workloads of RL-like
  samples over 8, 64, 256 and 1,024 equal lists (5 seeds each): with 16 a list, 3-14% over
  the mean from Karmarkar-Karp, 0.01-0.03% after; with 8 a list (the largest sample up to
  0.89 of a mean list), 2-41% before, 0.03-8.5% after (over 32 lists up to 18%, where one
  sample nears a mean list); at most 94 ms (8,192 samples; 110 ms for 4,096 over 512).
- `rearrange_micro_batches(batch, max_token_len, dp_group=None, num_batches_divided_by=None,
  same_micro_num_in_dp=True, min_num_micro_batch=None, use_dynamic_bsz_balance=True,
  force_group_size=1)`:
  verl's signature and return value ``(micro_batches, micro_bsz_idx)``, where ``batch`` is
  the TensorDict verl passes (lengths from its ``attention_mask``, or the rows of a
  nested ``input_ids``, jagged or strided). Where verl splits the batch into
  ``ceil(Σ L / max_token_len)`` partitions balanced by a workload proxy (which can exceed
  the token cap), this packs under the cap with `costmodel.scheduler.build_schedule`,
  balancing the chosen cost, so it may make more micro-batches; with
  ``same_micro_num_in_dp`` the ranks of ``dp_group`` agree on the largest count (an
  all-reduce, repeated until every rank has it).
  As verl at 0db13434, ``dp_group=None`` agrees over all processes (some verl versions
  skip the sync without a group, ``... and dp_group is not None``, and ranks then run
  different counts of collectives and hang, e.g. in dp_actor, which passes no group); pass
  ``same_micro_num_in_dp=False`` where only some processes call it. Where the cap and
  ``num_batches_divided_by`` need more micro-batches than there are sequences, verl runs
  micro-batches over the cap; this raises a ValueError instead, as it does for a run of
  ``force_group_size`` rows over the cap; ``num_batches_devided_by`` (older verl's
  spelling) is accepted.
- `get_group_balanced_partitions(seqlen_list, uid_list, k_partitions)`: verl's DP balancing
  under PrefixGrouper (a prompt's responses on one rank, every rank the same number of
  prompts), as verl-project/verl dde90e7d has it: Karmarkar-Karp with equal sizes over the
  uids' summed workload proxy, as there, then swaps of one uid for another between heavy
  and light ranks, which even out what it leaves (15% over the mean with 8 prompts a rank
  at dp 256, under that proxy; within 0.03% after).
- `balanced_micro_batches(seq_lengths, max_token_len, ...)`: the same on a plain list of
  lengths, and with ``dp_size > 1`` it schedules the whole batch over the ranks at once (no
  all-reduce needed: every rank gets the same count).

The default cost is verl's own workload proxy, ``24576·L + L²``; pass ``cost="flops"``
(with ``spec``), a cost model, or a callable to balance something better. verl's own call
sites pass only verl's arguments, so bind the cost where the function is swapped in:

    import functools
    from verl.utils import seqlen_balancing
    from costmodel.integrations import verl as cm_verl
    seqlen_balancing.rearrange_micro_batches = functools.partial(
        cm_verl.rearrange_micro_batches, cost="h200/qwen3-8b", spec="qwen3-8b")

(and in every module that imported the name itself: `grep -rn "import.*rearrange_micro_batches"
verl/`, e.g. verl/workers/engine/utils.py and the megatron actor and critic; dp_actor
reaches it through seqlen_balancing's own prepare_dynamic_batch). The same goes for
`get_seqlen_balanced_partitions`, which verl's trainers (the DP balancing of a step's
batch) and slime import by name; slime's training-side fallback (no rollout-side
schedule) partitions with it too, so patching it there reaches that path. verl's trainer
imports `get_group_balanced_partitions` from seqlen_balancing at each call, so setting it
there reaches it (it takes no cost: see its docstring).

A cost model prices training passes by default; forward-only ones (log-probs, the reference
model) have their own curves: ``mode="forward"`` where a call site only computes log-probs
(one swapped-in function serves both kinds of call in dp_actor: the training curves there).
"""

from __future__ import annotations

import functools
import logging
import operator
import os
from collections.abc import Iterable, Sized
from itertools import chain
from typing import Any, SupportsIndex

import numpy as np
from numpy.typing import ArrayLike

from costmodel.checks import plain_scalar, positive_int, refuse_meta, true_or_false
from costmodel.flops import as_lengths, on_host
from costmodel.integrations.args import gpu_mismatch, warn_once
from costmodel.integrations.verl_batch import batch_lengths, check_dict_rows, select_rows
from costmodel.scheduler import build_schedule
from costmodel.scheduler.bounds import round_up
from costmodel.scheduler.costs import AdditiveCost, ModelCost, as_cost
from costmodel.scheduler.groups import first_appearance_ids
from costmodel.scheduler.order import run_order
from costmodel.scheduler.set_swaps import karmarkar_karp_then_swaps
from costmodel.scheduler.sorting import as_lists, members_of

__all__ = [
    "VERL_WORKLOAD",
    "balanced_micro_batches",
    "get_group_balanced_partitions",
    "get_reverse_idx",
    "get_seqlen_balanced_partitions",
    "rearrange_micro_batches",
]

logger = logging.getLogger(__name__)


def _verl_workload(lengths: np.ndarray) -> np.ndarray:
    x = lengths.astype(np.float64)
    return 24576.0 * x + x * x


#: verl's `calculate_workload`: 24576·L + L² (a 7B-shaped FLOPs proxy).
VERL_WORKLOAD = AdditiveCost("verl workload 24576·L + L²", _verl_workload)


def _token_count(value: Any, name: str) -> int:
    """A count given the way verl computes it (a product of config values, or a value read
    from the batch): a 0-d tensor or a whole float is as good as an int."""
    value = plain_scalar(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return positive_int(value, name)


def get_seqlen_balanced_partitions(
    seqlen_list: ArrayLike, k_partitions: int, equal_size: bool
) -> list[list[int]]:
    """``k_partitions`` lists of indices with near-equal sums of ``seqlen_list`` (a list,
    numpy array or 1-D tensor); indices sorted inside each list; none empty. ``equal_size``:
    the same number of items in each. Karmarkar-Karp, as verl, then swaps of one item for
    another between heavy and light lists (each keeps its count)."""
    k_partitions = positive_int(k_partitions, "k_partitions")
    seqlen_list = on_host(seqlen_list, "seqlen_list")
    if isinstance(seqlen_list, (str, bytes)) or not isinstance(seqlen_list, Sized):
        raise ValueError(f"seqlen_list must be a sequence of numbers, got {seqlen_list!r:.60}")
    n = len(seqlen_list)
    if n < k_partitions:
        raise ValueError(f"number of items ({n}) < k_partitions ({k_partitions})")
    labels = karmarkar_karp_then_swaps(seqlen_list, k_partitions, equal_size, what="seqlen_list")
    parts = as_lists(*members_of(labels, k_partitions))
    for i, p in enumerate(parts):
        if not p:  # pragma: no cover - KK leaves no set empty when n >= k; swaps keep counts
            raise ValueError(f"partition {i} is empty")
    return parts


def get_group_balanced_partitions(
    seqlen_list: ArrayLike, uid_list: Any, k_partitions: int
) -> list[list[int]]:
    """verl's DP balancing with PrefixGrouper: ``k_partitions`` lists of sample indices
    (each sorted), every uid's samples in one list, each list the same number of uids.

    As verl: Karmarkar-Karp with equal sizes over the uids' summed workload proxy
    ``24576·L + L²``. Then, unlike verl, swaps of one uid for another between heavy and
    light lists (`costmodel.scheduler.set_swaps`), which even out what it leaves. Samples
    that share a uid stay together wherever they stand (verl's splits a uid whose rows are
    not contiguous into several).

    No ``cost``: balanced on the H200 profile's per-sample prices instead, the ranks'
    packed step times under that profile came out 0.3-1.6% longer than on this proxy, at
    8-1,024 ranks (`benchmarks/bench_group_partitions.py`): a rank's time also steps with
    its number of micro-batches, which no per-sample price sees.
    """
    k = positive_int(k_partitions, "k_partitions")
    lengths = as_lengths(seqlen_list, "seqlen_list")
    groups = first_appearance_ids(uid_list, "uid_list")
    if groups.size != lengths.size:
        raise ValueError(f"uid_list has {groups.size} entries for {lengths.size} sequences in "
                         "seqlen_list: give one uid per sequence")
    n_groups = int(groups.max()) + 1 if groups.size else 0
    if n_groups < k or n_groups % k:
        raise ValueError(f"{n_groups} uids cannot be spread evenly over k_partitions={k}: "
                         "every partition takes the same number of uids (verl: the batch size "
                         "a multiple of dp_size * rollout.n)")
    work = np.bincount(groups, weights=VERL_WORKLOAD.sample_costs(lengths), minlength=n_groups)
    partition_of_group = karmarkar_karp_then_swaps(work, k)
    return as_lists(*members_of(partition_of_group[groups], k))


def get_reverse_idx(idx_map: ArrayLike) -> list[int]:
    """The inverse permutation: ``out[idx_map[i]] = i``; ValueError unless ``idx_map`` (a
    list, numpy array or 1-D tensor of integers) is a permutation of 0..n-1 (a repeated index
    gave a wrong inverse, silently)."""
    entries = _entries(idx_map)
    n = len(entries)
    out = [-1] * n
    for i, entry in enumerate(entries):
        idx = _index(entry)
        if idx is None or not 0 <= idx < n or out[idx] >= 0:
            raise ValueError(f"idx_map must be a permutation of 0..{n - 1}; entry {i} is "
                             f"{entry!r:.40}")
        out[idx] = i
    return out


def _entries(idx_map: Any) -> list:
    """A numpy array's or torch tensor's entries as Python ints, its dtype checked once (per
    entry, numpy took 8x as long); a list or tuple as it is."""
    kind = str(getattr(idx_map, "dtype", "object"))
    if kind == "object":  # a list, or numpy holding Python objects: per entry
        if isinstance(idx_map, (str, bytes)) or not isinstance(idx_map, Iterable):
            raise ValueError(f"idx_map must be a list or 1-D array of indices, got "
                             f"{idx_map!r:.40}")
        return list(idx_map)
    if getattr(idx_map, "ndim", 1) != 1 or "int" not in kind:  # bool, float, 2-D
        raise ValueError(f"idx_map must be a 1-D integer permutation, got {kind} of shape "
                         f"{tuple(idx_map.shape)}")
    refuse_meta(idx_map, "idx_map", "indices", "give the indices themselves")
    return idx_map.tolist()


def _index(entry: Any) -> int | None:
    """``entry`` as a Python int (also a numpy integer or a 0-d torch tensor), or None for a
    float or a bool (a mask is no index map)."""
    if type(entry) is int:  # the common case, first: a list, or an array's tolist()
        return entry
    if isinstance(entry, (bool, np.bool_)) or "bool" in str(getattr(entry, "dtype", "")):
        return None
    if getattr(entry, "ndim", 0) != 0:  # a one-element tensor passes operator.index
        return None
    try:
        return operator.index(entry)
    except TypeError:
        return None


def rearrange_micro_batches(
    batch: Any,
    max_token_len: SupportsIndex | float,
    dp_group: Any = None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: SupportsIndex | float = 1,
    *,
    cost: Any = None,
    spec: Any = None,
    mode: str = "train",
    num_batches_devided_by: int | None = None,
) -> tuple[list, list[list[int]]]:
    """verl's `rearrange_micro_batches`, packing under the cap (see the module docstring).

    Args:
        batch: verl's TensorDict: ``attention_mask`` (B × S) gives the lengths, or a
            nested ``input_ids`` (jagged or strided) its rows.
        max_token_len: token cap of one micro-batch; a longer sequence is an error.
        dp_group: the data-parallel group whose ranks agree on the micro-batch count.
        num_batches_divided_by: the count a multiple of this (virtual pipeline stages).
        same_micro_num_in_dp: with torch.distributed initialised, every rank of
            ``dp_group`` makes as many micro-batches as the rank that needs the most.
        min_num_micro_batch: at least this many micro-batches.
        use_dynamic_bsz_balance: cheap micro-batches at both ends of the run order.
        force_group_size: runs of this many consecutive rows stay in one micro-batch
            (verl's reward-model pairs); the batch a multiple of it, each run under the
            cap. The scheduler packs each run as one sequence of all its tokens: two
            packings then differ by what they truly differ for a cost that sums per
            sequence parts (tokens, FLOPs, verl's workload, a cost model), so its choices
            are exact; a plain callable is priced approximately. Run order by true cost.
        cost, spec: what to balance (keyword-only extensions; default verl's workload).
        mode: the pass a cost model prices, "train" (forward+backward: actor updates) or
            "forward" (log-probs: ``compute_log_prob``, the reference model).
        num_batches_devided_by: older verl's spelling of ``num_batches_divided_by``.

    Returns:
        ``(micro_batches, micro_bsz_idx)``: the batch's rows for each micro-batch, and their
        indices into ``batch``, in run order (verl's `get_reverse_idx` of the flattened
        indices restores the original order).
    """
    if num_batches_devided_by is not None:
        if num_batches_divided_by is not None:
            raise ValueError("give num_batches_divided_by or num_batches_devided_by, not both")
        num_batches_divided_by = num_batches_devided_by
    # This rank's batch is read inside `schedule`, so that a rank whose batch is bad
    # raises only after telling the others (who would otherwise wait in the all-reduce).
    group = _token_count(force_group_size, "force_group_size")
    same_micro_num_in_dp = true_or_false(same_micro_num_in_dp, "same_micro_num_in_dp")
    use_dynamic_bsz_balance = true_or_false(use_dynamic_bsz_balance, "use_dynamic_bsz_balance")
    kwargs = dict(num_batches_divided_by=num_batches_divided_by,
                  use_dynamic_bsz_balance=use_dynamic_bsz_balance and group == 1, cost=cost,
                  spec=spec, mode=mode)

    @functools.cache
    def lengths_and_units() -> tuple[np.ndarray, np.ndarray]:
        lengths = batch_lengths(batch)
        check_dict_rows(batch, lengths.size)  # here, so a bad rank tells the others first
        return lengths, (lengths if group == 1 else _group_lengths(lengths, group, max_token_len))

    def schedule(min_count: int | None) -> list[list[int]]:
        lengths, units = lengths_and_units()
        try:
            micro_bsz_idx = balanced_micro_batches(units, max_token_len,
                                                   min_num_micro_batch=min_count, **kwargs)[0]
        except ValueError as exc:
            if group == 1:
                raise
            raise ValueError(f"{exc} (with force_group_size={group}, a sequence here is a run "
                             f"of {group} rows)") from exc
        if group == 1:
            return micro_bsz_idx
        rows = [[unit * group + r for unit in mb for r in range(group)] for mb in micro_bsz_idx]
        return _pipeline_order(rows, lengths, cost, spec, mode) if use_dynamic_bsz_balance else rows

    if same_micro_num_in_dp:
        micro_bsz_idx = _agree_on_count(schedule, min_num_micro_batch, dp_group)
    else:
        micro_bsz_idx = schedule(min_num_micro_batch)
    return [select_rows(batch, idx) for idx in micro_bsz_idx], micro_bsz_idx


# Rounds of all-reduce + reschedule before the ranks give up agreeing (each round the
# largest count grows or every rank matches it; in practice one or two rounds).
_AGREE_ROUNDS = 16


def _agree_on_count(schedule, min_count: int | None, group: Any) -> list:
    """``schedule(min_count)`` on every rank of ``group``, then as many micro-batches on
    each as the rank that needs the most: a rank with fewer reschedules with that count as
    its minimum, until all agree.

    The scheduler gives exactly the count asked for whenever it finds a packing, but that
    is a heuristic, so it is checked, not assumed: every round all ranks learn the largest
    and smallest count, and whether a rank failed, from one all-reduce, and so take the
    same decision; none is left waiting in a collective the others skipped. When a rank
    fails (a sequence over the cap, fewer samples than the count), it raises its error
    and every other rank raises a ValueError saying so.
    """
    micro_bsz_idx: list = []
    failed: Exception | None = None
    try:
        micro_bsz_idx = schedule(min_count)
    except Exception as exc:  # raised below, after the other ranks have heard of it
        failed = exc
    count = len(micro_bsz_idx)
    for _ in range(_AGREE_ROUNDS):
        most, fewest, failed_rank = _count_extremes(count, failed is not None, group)
        if failed is not None:
            raise failed
        if failed_rank is not None:
            raise ValueError(
                f"same_micro_num_in_dp: rank {failed_rank} of the data-parallel group could "
                f"not schedule its micro-batches (this rank made {count}); see that rank's "
                "error"
            )
        if most == fewest:
            return micro_bsz_idx
        if count < most:
            try:
                micro_bsz_idx = schedule(most)
                count = len(micro_bsz_idx)
            except ValueError as exc:  # too few samples for `most`: say so, on every rank
                # (in the caller's terms: the count asked for here is not its parameter)
                few = exc if isinstance(exc, TooFewSequences) else exc.__cause__
                why = (f"it holds only {few.have} sequences, and a micro-batch holds at least "
                       "one" if isinstance(few, TooFewSequences) else str(exc))
                failed = ValueError(
                    f"same_micro_num_in_dp (the same micro-batch count across DP ranks): this "
                    f"rank cannot make the {most} micro-batches another rank of the "
                    f"data-parallel group needs ({why}); give every rank "
                    "enough samples, raise max_token_len, or set same_micro_num_in_dp=False"
                )
            except Exception as exc:  # anything else: raised after the next all-reduce
                failed = exc
    if failed is not None:  # failed in the last round: its own error, not "did not agree"
        raise failed
    raise RuntimeError(
        f"same_micro_num_in_dp: the ranks did not agree on a micro-batch count in "
        f"{_AGREE_ROUNDS} rounds (this rank: {count}); set same_micro_num_in_dp=False"
    )


def _check_enough_sequences(
    lengths: np.ndarray, dp_size: int, divided_by: int | None, min_count: int | None
) -> None:
    """ValueError, in verl's parameter names, when a rank has fewer sequences than the
    micro-batches asked for (each micro-batch holds at least one)."""
    if lengths.ndim != 1 or not isinstance(dp_size, int) or dp_size < 1:
        return  # build_schedule says what is wrong with these
    need = round_up(max(min_count or 1, 1), divided_by or 1)
    have = lengths.size // dp_size
    if have >= need or have < 1:
        return  # enough, or too few for dp_size itself: build_schedule's message names it
    asking = {name: value for name, value in (("min_num_micro_batch", min_count),
                                              ("num_batches_divided_by", divided_by))
              if value is not None and value > 1}  # need > 1: one of them is
    where = " per rank" if dp_size > 1 else ""
    given = " and ".join(f"{name}={value}" for name, value in asking.items())
    raise TooFewSequences(
        f"{given} ask{'s' if len(asking) == 1 else ''} for {need} micro-batches{where}, but "
        f"there are only {have} sequences{where} (a micro-batch holds at least one): lower "
        f"{' or '.join(asking)}, or bring more sequences", have=have,
    )


class TooFewSequences(ValueError):
    """Fewer sequences than the micro-batches asked for (``have`` per rank)."""

    def __init__(self, message: str, *, have: int):
        super().__init__(message)
        self.have = have


def _group_lengths(lengths: np.ndarray, group: int, max_token_len: Any) -> np.ndarray:
    """Tokens of each run of ``group`` consecutive rows (verl's force_group_size), which go
    into one micro-batch together; a run over the cap is an error (verl would run it over)."""
    if lengths.size % group:
        raise ValueError(f"the batch has {lengths.size} rows, not a multiple of "
                         f"force_group_size={group}")
    units = lengths.reshape(-1, group).sum(axis=1)
    cap = _token_count(max_token_len, "max_token_len")
    over = np.flatnonzero(units > cap)
    if over.size:
        first = int(over[0]) * group
        raise ValueError(f"rows {first}..{first + group - 1}, kept together by "
                         f"force_group_size={group}, have {int(units[over[0]])} tokens, over "
                         f"max_token_len={cap} ({over.size} such groups): raise max_token_len")
    return units


def _pipeline_order(rows: list[list[int]], lengths: np.ndarray, cost: Any,
                    spec: Any, mode: str) -> list[list[int]]:
    """Micro-batches of rows in verl's pipeline order by their cost: cheap ones at both
    ends (the scheduler ordered whole groups, each priced as one sequence)."""
    offsets = np.cumsum([0] + [len(mb) for mb in rows])
    costs = as_cost(VERL_WORKLOAD if cost is None else cost, spec=spec, mode=mode).evaluate(
        lengths[np.concatenate(rows)], offsets)
    return [rows[i] for i in run_order(costs, "pipeline")]


def _collective_device(group: Any):
    """Where ``group``'s backend takes its tensors: the CPU for gloo (or without an
    accelerator: mpi), else this process's current accelerator (nccl: CUDA; hccl: NPU)."""
    import torch
    import torch.distributed as dist

    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    if accelerator is not None:
        current = accelerator.current_accelerator()
    else:
        current = torch.device("cuda") if torch.cuda.is_available() else None
    if dist.get_backend(group) == "gloo" or current is None:
        return torch.device("cpu")
    return torch.device(current.type, torch.get_device_module(current.type).current_device())


def _count_extremes(count: int, failed: bool, group: Any) -> tuple[int, int, int | None]:
    """(largest count, smallest count, a failed rank or None) over the ranks of ``group``
    (its highest failed rank, by its rank in the group), from one all-reduce; this rank's
    own without torch.distributed."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return count, count, (0 if failed else None)
    if not dist.is_available() or not dist.is_initialized():
        return count, count, (0 if failed else None)
    me = dist.get_rank(group) + 1 if failed else 0  # 0: no failure here
    t = torch.tensor([count, -count, me], dtype=torch.int64, device=_collective_device(group))
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    most, neg_fewest, failed_rank = t.tolist()
    return most, -neg_fewest, (failed_rank - 1 if failed_rank else None)


def balanced_micro_batches(
    seq_lengths: ArrayLike,
    max_token_len: SupportsIndex | float,
    *,
    dp_size: int = 1,
    same_micro_num_in_dp: bool = True,
    num_batches_divided_by: int | None = None,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    cost: Any = None,
    spec: Any = None,
    mode: str = "train",
) -> tuple[list, list[int]]:
    """Micro-batches (index lists) under ``max_token_len``, and the reverse index, for a
    plain list of lengths.

    Args:
        seq_lengths: tokens per sequence (for ``dp_size > 1``: the whole batch).
        max_token_len: token cap of one micro-batch; a longer sequence is an error, as in
            verl.
        dp_size: ranks to spread the batch over.
        same_micro_num_in_dp: every rank runs the same number of micro-batches (always so
            within one call; False schedules each rank's share again on its own: the fewest
            that pack under a cost that sums per sample, and what a cost model prices
            lowest, which can be more; one scheduler call per rank).
        num_batches_divided_by: micro-batch count a multiple of this (virtual pipeline).
        min_num_micro_batch: at least this many micro-batches (per rank).
        use_dynamic_bsz_balance: cheap micro-batches at both ends of a rank's run order
            (verl's ordering, for pipeline bubbles); else the order they were packed in.
        cost: what to balance; default verl's workload ``24576·L + L²``.
        spec: model for ``cost="flops"``.
        mode: the pass a cost model prices: "train" or "forward" (log-probs).

    Returns:
        With ``dp_size == 1``: ``(micro_bsz_idx, reverse_idx)``: lists of indices into
        ``seq_lengths``, in run order, and for every sequence its position in the
        micro-batches laid end to end (verl's `get_reverse_idx` of the flattened order).
        With ``dp_size > 1``: ``(per_rank, reverse_idx)``: ``per_rank[r]`` is rank r's list of
        micro-batches, and ``reverse_idx`` maps every sequence to its position in all
        ranks' micro-batches laid end to end, rank after rank.
    """
    # Checked here so that errors name verl's parameters, not build_schedule's.
    max_token_len = _token_count(max_token_len, "max_token_len")
    for name, value in (("num_batches_divided_by", num_batches_divided_by),
                        ("min_num_micro_batch", min_num_micro_batch)):
        if value is not None:
            positive_int(value, name)
    same_micro_num_in_dp = true_or_false(same_micro_num_in_dp, "same_micro_num_in_dp")
    use_dynamic_bsz_balance = true_or_false(use_dynamic_bsz_balance, "use_dynamic_bsz_balance")
    lengths = as_lengths(seq_lengths, "seq_lengths")  # named as verl names it
    over = np.flatnonzero(lengths > max_token_len)
    if len(over):
        raise ValueError(f"sequence {int(over[0])} has {int(lengths[over[0]])} tokens, over "
                         f"max_token_len={max_token_len} ({len(over)} such): every sequence must "
                         "fit one micro-batch, as in verl; raise max_token_len")
    _check_enough_sequences(lengths, dp_size, num_batches_divided_by, min_num_micro_batch)
    order = "pipeline" if use_dynamic_bsz_balance else "none"
    # The file as given (a path or shipped name): what `costmodel validate FILE` takes.
    given = os.fspath(cost) if isinstance(cost, (str, os.PathLike)) else None
    cost = as_cost(VERL_WORKLOAD if cost is None else cost, spec=spec, mode=mode)
    if isinstance(cost, ModelCost):  # a file from another GPU or software: say so, once
        why = gpu_mismatch(cost.model, start_cuda=False)  # verl's call runs on the GPU
        if why:
            label = getattr(cost.model, "label", cost.name)
            warn_once(logger, f"cost model {given} ({label}) {why}" if given
                      else f"cost model {label} {why}")
    kwargs = dict(
        max_tokens_per_microbatch=max_token_len,
        cost=cost,
        spec=spec,
        mode=mode,
        align=num_batches_divided_by or 1,
        order=order,
        strict=True,
        min_num_microbatches=min_num_micro_batch,
    )
    try:
        s = build_schedule(lengths, dp_size=dp_size, **kwargs)
    except ValueError as exc:
        if "max_tokens_per_microbatch" not in str(exc):
            raise
        raise ValueError(f"{exc} (in verl's terms: max_tokens_per_microbatch is max_token_len, "
                         "align is num_batches_divided_by)") from exc
    per_rank = s.microbatches
    if dp_size > 1 and not same_micro_num_in_dp:
        # Each rank's share scheduled again on its own, as verl's per-rank call would.
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
