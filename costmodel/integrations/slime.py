"""A drop-in for slime's `build_dp_schedule` (slime/utils/dp_schedule.py).

    from costmodel.integrations.slime import build_dp_schedule
    partitions, micro_batch_indices, num_microbatches, global_batch_sizes = build_dp_schedule(
        args, train_parallel_config, total_lengths,
        global_batch_size=args.global_batch_size, rollout_indices=rollout_indices)

Same arguments, same return value, same invariants as slime's. slime's signature has
changed across releases; both that the upstream repository has had are taken (checked
against THUDM/slime's dp_schedule.py at 04e67434 and at b1de73ca): steps of
``global_batch_size`` rollouts given ``rollout_indices`` (above), or steps a custom splitter
made, ``build_dp_schedule(args, config, total_lengths, step_sample_indices=steps)``.
Invariants:

- samples of one rollout (equal ``rollout_indices``) stay in one step; steps take
  ``global_batch_size`` rollouts in order of first appearance; trailing rollouts that do
  not fill a step are dropped (with ``allow_partial_train_step`` and dynamic batch size,
  as in slime forks such as radixark/miles, they train as one smaller final step when they
  hold at least ``dp_size`` samples);
- per step, every rank runs the same number of micro-batches, a multiple of the VPP
  micro-batch group (so the step's count is a multiple of ``dp_size × group``);
- ``partitions[r]`` lists rank r's global sample indices step after step, and
  ``micro_batch_indices[r]`` tiles ``range(len(partitions[r]))`` in order;
- ``num_microbatches[s]`` is the per-rank count of step s, ``global_batch_sizes[s]`` its
  number of rollouts.

What it honours on ``args``: ``use_dynamic_batch_size`` with ``max_tokens_per_gpu``
(× ``cp_size``, × ``packing_safety_margin`` when set, as slime does), or ``micro_batch_size``
for fixed-size micro-batches; ``balance_data``, ``balance_by_flops``,
``allow_partial_train_step``; and a new
``cost_model`` (a calibrated file or a shipped name such as ``h200/qwen3-8b``; absent or
None for none), priced as one rank of the ``cp_size`` group runs a micro-batch
(`CostModel.for_context_parallel`). Model shape for FLOPs comes from the Megatron-style fields on ``args``
(`ModelSpec.from_megatron_args`).

Differences from slime, all on purpose:

- with dynamic batch size and any balancing flag (``balance_data``, ``balance_by_flops``
  or ``cost_model``), `costmodel.scheduler.build_schedule` packs and distributes: by the
  cost model if ``cost_model`` is set, else by exact analytic FLOPs (``balance_data``
  alone, with no model shape on ``args`` at all: by tokens, with a warning). slime packs first fit
  and then balances whole micro-batches over ranks only with ``balance_data`` (by FLOPs or
  by tokens, depending on the release); some releases' ``balance_by_flops`` splits samples
  into micro-batches by FLOPs and can break the token cap, and without ``balance_data``
  slime deals the micro-batches out strided. Here the cap
  always holds (a single sample longer than it sits alone, as in slime) and the ranks are
  always balanced;
- with fixed-size micro-batches, ``balance_by_flops`` (or ``cost_model``) alone also
  balances the ranks (slime ignores ``balance_by_flops`` there);
- without any flag, the micro-batches are slime's (first fit by tokens, the largest split
  until the count aligns, strided over ranks); sample indices inside a micro-batch are
  ascending (slime keeps a split micro-batch's samples longest first: same samples);
- ``global_batch_tokens`` (token-budget steps) and multimodal-aware packing are not
  supported: setting them is a ValueError rather than a silently different schedule;
- impossible inputs raise ValueError naming the step and what to change, instead of
  AssertionError.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Collection, Mapping, Sequence, Sized
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from costmodel.checks import cost_model_choice, on_off, positive_int, whole_number
from costmodel.flops import MAX_LENGTH, as_lengths, on_host
from costmodel.integrations.args import (
    gpu_mismatch,
    run_tensor_parallel,
    tensor_parallel_mismatch,
    warn_once,
)
from costmodel.scheduler import build_schedule
from costmodel.scheduler.baselines import align_bins, first_fit_pack
from costmodel.scheduler.costs import as_cost
from costmodel.scheduler.groups import first_appearance_ids
from costmodel.scheduler.set_swaps import karmarkar_karp_then_swaps
from costmodel.scheduler.sorting import as_lists, members_of

__all__ = ["build_dp_schedule"]

logger = logging.getLogger(__name__)


def _spec_from_args(args: Any):
    from costmodel.spec import ModelSpec

    return ModelSpec.from_megatron_args(args)


def _resolve_cost(args: Any) -> tuple[Any, Any, bool]:
    """(cost, spec, balance) from the flags."""
    cost_model = cost_model_choice(getattr(args, "cost_model", None), "cost_model")
    by_flops = _on(args, "balance_by_flops")
    balance = _on(args, "balance_data") or by_flops or cost_model is not None
    if cost_model is not None:
        from costmodel.model import cached_cost_model  # called once per step

        try:
            spec = _spec_from_args(args)
        except ValueError as err:
            logger.warning("model shape not on args (%s); cost model shape not checked", err)
            spec = None
        allow = _on(args, "cost_model_allow_other_shape")
        model = cached_cost_model(cost_model, spec=spec, allow_other_shape=allow)
        why = tensor_parallel_mismatch(model, *run_tensor_parallel(args, as_flags=False))
        if why:
            warn_once(logger, f"cost_model {cost_model}: {why}")
        # The drop-in may run where no GPU is used (slime's rollout side): never start CUDA.
        why = gpu_mismatch(model, start_cuda=False)
        if why:
            warn_once(logger, f"cost_model {cost_model} {why}")
        return model, spec, balance
    if balance:
        no_shape = all(getattr(args, key, None) is None for key in _SHAPE_FIELDS)
        if no_shape and not by_flops:
            # balance_data alone: slime balanced it by tokens in some releases, by FLOPs in
            # others; with no model shape on args at all, tokens it is (a shape that is
            # there but wrong is still an error).
            warn_once(logger, "balance_data: no model shape on args (hidden_size, "
                      "num_attention_heads, num_layers); balancing tokens, not FLOPs")
            return "tokens", None, balance
        try:
            return "flops", _spec_from_args(args), balance
        except ValueError as err:
            flag = "balance_by_flops" if by_flops else "balance_data"
            raise ValueError(f"{flag} balances analytic FLOPs, which need the model shape: {err}") from None
    return "tokens", None, balance


# Megatron's model-shape fields: with none of them on args, balance_data balances tokens.
_SHAPE_FIELDS = ("hidden_size", "num_attention_heads", "num_layers")


def _on(args: Any, name: str) -> bool:
    """A switch on slime's args; the string "False" from a config is refused, not on."""
    return on_off(getattr(args, name, None), name)


def _steps(rollout_ids: np.ndarray, global_batch_size: int, *, partial_min_samples: int | None = None
           ) -> tuple[list[list[int]], list[int]]:
    """Sample positions of each step (whole rollouts, global_batch_size per step) and each
    step's rollout count. ``rollout_ids``: each sample's rollout, numbered by first
    appearance. ``partial_min_samples`` (slime forks' ``--allow-partial-train-step``): the
    trailing rollouts that fill no whole step train as one smaller final step when they
    hold at least that many samples (dp_size), instead of being dropped."""
    rollouts: list[list[int]] = [[] for _ in range(int(rollout_ids.max()) + 1 if rollout_ids.size else 0)]
    for pos, rid in enumerate(rollout_ids.tolist()):
        rollouts[rid].append(pos)
    num_steps = len(rollouts) // global_batch_size
    if num_steps < 1:
        raise ValueError(
            f"{len(rollouts)} rollouts cannot fill one step of global_batch_size="
            f"{global_batch_size} rollouts: lower global_batch_size or bring more rollouts"
        )
    counts = [global_batch_size] * num_steps
    leftover = rollouts[num_steps * global_batch_size:]
    if leftover and partial_min_samples is not None:
        held = sum(len(r) for r in leftover)
        if held >= partial_min_samples:
            counts.append(len(leftover))
        else:
            logger.info("allow_partial_train_step: the last %d rollout(s) hold %d sample(s), "
                        "fewer than dp_size=%d; not trained", len(leftover), held,
                        partial_min_samples)
    steps, start = [], 0
    for count in counts:
        steps.append([pos for r in rollouts[start:start + count] for pos in r])
        start += count
    return steps, counts


def _positions(step: Any, n: int, what: str) -> list[int]:
    """Sample positions as Python ints: whole numbers in range(n), none twice."""
    try:
        values = np.asarray(step.tolist() if hasattr(step, "tolist") else list(step), dtype=object)
    except TypeError:  # a bare position (TypeError "'int' object is not iterable"): 0-d
        values = np.asarray(step, dtype=object)
    if values.ndim != 1 or values.size == 0:
        # One step's positions given flat, [0, 1, 2], reads as steps of one number each.
        hint = " (one step of samples 0, 1, 2 is [[0, 1, 2]])" if values.ndim == 0 else ""
        raise ValueError(f"{what} must be a non-empty list of sample positions, got "
                         f"{step!r:.60}{hint}")
    out = []
    for v in values.tolist():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < n:
            raise ValueError(f"{what}: {v!r} is not a sample position in 0..{n - 1}")
        out.append(int(v))
    if len(set(out)) < len(out):
        raise ValueError(f"{what} lists a sample twice")
    return out


def _given_steps(step_sample_indices: Any, n: int) -> list[list[int]]:
    """The steps a caller split itself (slime's ``custom_rollout_step_split``), checked: a
    non-empty list of lists of sample positions in range, none in two steps (a 2-D array or
    tensor: a step a row). Samples in no step are dropped, with a warning, as slime does."""
    if getattr(step_sample_indices, "is_nested", False):  # a step a row; torch's default
        # (strided) layout has no shape to read: "Internal error ... Please file an issue"
        step_sample_indices = list(on_host(step_sample_indices, "step_sample_indices",
                                           nested=True).unbind())
    shape = getattr(step_sample_indices, "shape", None)
    if shape is not None and len(shape) == 2 and shape[0] and shape[1]:
        step_sample_indices = list(on_host(step_sample_indices, "step_sample_indices", nested=True))
    if isinstance(step_sample_indices, (str, bytes)) or not isinstance(step_sample_indices, Sequence) \
            or not step_sample_indices:
        got = (f"an array of shape {tuple(shape)}" if shape is not None  # its repr spans lines
               else f"{step_sample_indices!r:.60}")
        raise ValueError("step_sample_indices must be a non-empty list of steps, each a list of "
                         f"sample positions (or a 2-D array, a step a row), got {got}")
    steps: list[list[int]] = []
    seen: set[int] = set()
    for s, step in enumerate(step_sample_indices):
        positions = _positions(step, n, f"step_sample_indices[{s}]")
        again = seen.intersection(positions)
        if again:
            raise ValueError(f"step_sample_indices[{s}] repeats sample(s) of an earlier step: "
                             f"{sorted(again)[:5]}")
        seen.update(positions)
        steps.append(positions)
    if len(seen) < n:
        logger.warning("step_sample_indices leave out %d of %d samples; they are not trained on",
                       n - len(seen), n)
    return steps


def build_dp_schedule(
    args: Any,
    train_parallel_config: Mapping[str, Any],
    total_lengths: ArrayLike,
    *,
    global_batch_size: int | None = None,
    rollout_indices: Collection[Any] | None = None,
    sample_is_multimodal: Collection[bool] | None = None,
    step_sample_indices: Sequence[ArrayLike] | None = None,
) -> tuple[list[list[int]], list[list[list[int]]], list[int], list[int]]:
    """Per-rank sample partition and micro-batch schedule, step by step (see module doc).

    Steps come from ``global_batch_size`` rollouts each (``rollout_indices``: each sample's
    rollout), or, as in the slime releases whose steps a custom splitter makes, from
    ``step_sample_indices`` (each step's sample positions; its ``global_batch_sizes`` entry
    is its sample count). ``sample_is_multimodal`` is accepted as slime's signature has it;
    it only matters to multimodal-aware packing, which this drop-in refuses.
    ``total_lengths``, ``rollout_indices`` and each step's positions may be lists, numpy
    arrays or 1-D tensors.

    Returns ``(partitions, micro_batch_indices, num_microbatches, global_batch_sizes)``.
    """
    if not isinstance(train_parallel_config, Mapping) or "dp_size" not in train_parallel_config:
        raise ValueError(f"train_parallel_config must be a dict with 'dp_size' (and optionally "
                         f"cp_size, vpp_size, ...), got {train_parallel_config!r:.80}")
    config = train_parallel_config
    dp = positive_int(config["dp_size"], "dp_size")
    # Absent or None: no such parallelism. 0 is refused, not read as 1 (a config bug).
    cp, vpp, group = (positive_int(1 if config.get(key) is None else config[key], key)
                      for key in ("cp_size", "vpp_size", "microbatch_group_size_per_vp_stage"))
    align = group if vpp > 1 else 1
    lengths = as_lengths(total_lengths, "total_lengths")

    if sample_is_multimodal is not None and not isinstance(sample_is_multimodal, Sized):
        raise ValueError(f"sample_is_multimodal must be one flag per sample (a list), got "
                         f"{type(sample_is_multimodal).__name__}")
    if sample_is_multimodal is not None and len(sample_is_multimodal) != lengths.size:
        raise ValueError(
            f"sample_is_multimodal has {len(sample_is_multimodal)} entries for {lengths.size} "
            "samples"
        )
    legacy = [name for name, value in (("global_batch_size", global_batch_size),
                                       ("rollout_indices", rollout_indices)) if value is not None]
    if step_sample_indices is not None and legacy:
        raise ValueError(f"step_sample_indices sets the steps; {' and '.join(legacy)} would be "
                         "ignored: give one or the other, not both")
    if step_sample_indices is None and len(legacy) < 2:
        raise ValueError("give global_batch_size and rollout_indices (steps of whole rollouts), "
                         "or step_sample_indices (the steps' sample positions)")
    if step_sample_indices is not None:
        steps = _given_steps(step_sample_indices, lengths.size)
        step_sizes = [len(step) for step in steps]
    else:
        global_batch_size = positive_int(global_batch_size, "global_batch_size")
        rollout_ids = first_appearance_ids(rollout_indices, "rollout_indices")
        if rollout_ids.size != lengths.size:
            raise ValueError(f"rollout_indices has {rollout_ids.size} entries for {lengths.size} samples")
        # slime forks (miles) train the trailing rollouts as one smaller final step with
        # --allow-partial-train-step, with dynamic batch size only (as there).
        partial = (_on(args, "allow_partial_train_step")
                   and _on(args, "use_dynamic_batch_size"))
        steps, step_sizes = _steps(rollout_ids, global_batch_size,
                                   partial_min_samples=dp if partial else None)
    for unsupported in ("global_batch_tokens", "multimodal_aware_packing"):
        if getattr(args, unsupported, None) not in (None, "off"):
            raise ValueError(
                f"{unsupported}={getattr(args, unsupported)!r} is not supported by the costmodel "
                f"drop-in; unset it or use slime's own build_dp_schedule"
            )
    dynamic = _on(args, "use_dynamic_batch_size")
    cost, spec, balance = _resolve_cost(args)
    if hasattr(cost, "for_context_parallel"):  # a cost model: what one rank of cp_size takes
        cost = cost.for_context_parallel(cp)
    cap: int | None = None  # the token cap: set exactly when dynamic
    if dynamic:
        per_gpu = getattr(args, "max_tokens_per_gpu", None)
        if per_gpu is None:
            raise ValueError("use_dynamic_batch_size needs max_tokens_per_gpu >= 1")
        per_gpu = whole_number(per_gpu, "max_tokens_per_gpu")
        margin = getattr(args, "packing_safety_margin", None)
        margin = 1.0 if margin is None else margin
        if (isinstance(margin, (bool, np.bool_)) or not isinstance(margin, (int, float, np.number))
                or not 0 < margin <= 1):  # np.float32(0.9) from a config is a margin too
            raise ValueError(f"packing_safety_margin must be in (0, 1], got {margin!r}")
        # The cap is what packs: per GPU × cp × margin. Compared as an int with a float,
        # exactly, before the product (10**400 × 0.9 overflowed).
        if per_gpu * cp < 1 or per_gpu * cp > MAX_LENGTH / float(margin):
            shown = f"{per_gpu:,}" if abs(per_gpu) < 10**15 else f"a {len(str(per_gpu))}-digit number"
            raise ValueError(f"max_tokens_per_gpu × cp_size × packing_safety_margin must be "
                             f"1..{MAX_LENGTH:,} tokens, got {shown} × {cp} × {margin}")
        cap = max(1, int(per_gpu * cp * margin))
    else:
        mbs = getattr(args, "micro_batch_size", None)
        if mbs is None:
            raise ValueError("without use_dynamic_batch_size, micro_batch_size must be >= 1")
        positive_int(mbs, "micro_batch_size")

    partitions: list[list[int]] = [[] for _ in range(dp)]
    micro_batch_indices: list[list[list[int]]] = [[] for _ in range(dp)]
    num_microbatches: list[int] = []
    global_batch_sizes: list[int] = []
    for step, (samples, step_size) in enumerate(zip(steps, step_sizes)):
        step_lengths = lengths[samples]
        try:
            if cap is not None and balance:
                per_rank = build_schedule(
                    step_lengths,
                    dp_size=dp,
                    max_tokens_per_microbatch=cap,
                    cost=cost,
                    spec=spec,
                    align=align,
                ).microbatches
            elif cap is not None:
                per_rank = _first_fit_strided(step_lengths, dp, align, cap)
            else:
                per_rank = _static(
                    step_lengths, dp, align, int(args.micro_batch_size), cost, spec, balance
                )
        except ValueError as err:
            raise ValueError(f"step {step} ({len(samples)} samples): {err}{_in_slimes_terms(err)}") from err
        num_microbatches.append(len(per_rank[0]))
        global_batch_sizes.append(step_size)
        for r in range(dp):
            for mb in per_rank[r]:
                start = len(partitions[r])
                partitions[r].extend(samples[i] for i in mb)
                micro_batch_indices[r].append(list(range(start, start + len(mb))))
    return partitions, micro_batch_indices, num_microbatches, global_batch_sizes


def _in_slimes_terms(err: ValueError) -> str:
    """The scheduler's parameter names an error uses, said in slime's."""
    said = str(err)
    terms = [(name, slimes) for name, slimes in (
        ("align", "microbatch_group_size_per_vp_stage (with vpp_size > 1)"),
        ("max_tokens_per_microbatch", "max_tokens_per_gpu x cp_size x packing_safety_margin"),
    ) if re.search(rf"\b{name}\b", said)]
    return (" (in slime's terms: " + "; ".join(f"{a} is {b}" for a, b in terms) + ")") if terms else ""


def _first_fit_strided(lengths: np.ndarray, dp: int, align: int, cap: int) -> list[list[list[int]]]:
    """slime without balancing: first fit, split the largest until aligned, strided."""
    lens = lengths.tolist()
    bins = first_fit_pack(lens, cap)
    align_bins(bins, dp * align, lens)
    return [[sorted(bins[k]) for k in range(r, len(bins), dp)] for r in range(dp)]


def _static(
    lengths: np.ndarray,
    dp: int,
    align: int,
    micro_batch_size: int,
    cost: Any,
    spec: Any,
    balance: bool,
) -> list[list[list[int]]]:
    """Fixed-size micro-batches of consecutive samples; balanced by cost or strided."""
    n = lengths.size
    bins = [list(range(i, min(i + micro_batch_size, n))) for i in range(0, n, micro_batch_size)]
    align_to = dp * align
    if len(bins) % align_to:
        raise ValueError(
            f"{n} samples make {len(bins)} micro-batches of {micro_batch_size}, "
            f"not a multiple of dp_size × micro-batch group = {align_to}; make the step's "
            f"sample count a multiple of {align_to * micro_batch_size}"
        )
    if not balance:
        return [bins[r::dp] for r in range(dp)]
    cost_obj = as_cost(cost, spec)
    offsets = np.concatenate([[0], np.cumsum([len(b) for b in bins])]).astype(np.int64)
    weights = cost_obj.evaluate(lengths.astype(np.int64), offsets)
    # Karmarkar-Karp with equal sizes, then swaps: with a few micro-batches a rank it left
    # ranks far apart (`set_swaps`).
    ranks = karmarkar_karp_then_swaps(weights, dp)
    return [[bins[k] for k in part] for part in as_lists(*members_of(ranks, dp))]
