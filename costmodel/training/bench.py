"""`costmodel bench-schedule`: what each scheduling policy buys in *measured* step time.

For a batch of lengths, a model, a token cap and each DP size, build one schedule per
policy —

- ``tokens``: balance Σ tokens (classic dynamic batching),
- ``flops``: balance exact analytic FLOPs (of one layer, as measured: `OneLayerCost`),
- ``baseline``: what RL frameworks run today: first-fit packing by tokens, then
  Karmarkar-Karp over micro-batch FLOPs to ranks (`costmodel.scheduler.baselines`),
- ``calibrated``: balance the predicted time of a calibrated cost model (one layer),

then time every simulated rank by running its micro-batches, forward and backward (mode
"train"; "forward": forward only, a log-prob pass), through one real layer
(`costmodel.kernels.layer.TransformerLayer`) on one GPU, the policies
interleaved micro-batch by micro-batch (a second round in reverse order, against drift).
A rank's time is the sum of its micro-batches' times; the step's makespan is the slowest
rank. One layer stands for the model: every layer of a dense model does the same work,
and the per-rank sums compare policies on equal terms.

The measurement is injectable: ``measure(lengths) -> ms`` times one micro-batch
(`costmodel.training.microbatch_timer`: interleaved rounds, medians, `LayerTimer` on a
GPU; CPU tests pass a fake measurer). The table and target checks are in
`costmodel.training.bench_report`. Numpy only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Any, NamedTuple

import numpy as np

from costmodel.training.microbatch_timer import (
    Measure,
    measure_microbatches,
    microbatch_key,
    noise_floor,
)

__all__ = [
    "POLICIES",
    "OneLayerCost",
    "PolicyRun",
    "build_policy_schedules",
    "measure_benchmark",
    "plan_benchmark",
]

logger = logging.getLogger(__name__)

POLICIES: tuple[str, ...] = ("tokens", "flops", "baseline", "calibrated")

Schedule = list[list[list[int]]]  # rank -> micro-batch -> global sample indices


# ----------------------------------------------------------------------------- schedules
def _baseline_schedule(lengths: np.ndarray, *, dp_size: int, cap: int, spec,
                       align: int = 1) -> Schedule:
    """First-fit by tokens, then Karmarkar-Karp over micro-batch FLOPs to ranks."""
    from costmodel.scheduler import baselines

    result = baselines.first_fit_then_karmarkar_karp(
        lengths, dp_size=dp_size, max_tokens_per_microbatch=cap, spec=spec, align=align
    )
    return _as_rank_lists(result)


def _as_rank_lists(result: Any) -> Schedule:
    micro = getattr(result, "microbatches", result)
    return [[[int(i) for i in mb] for mb in rank] for rank in micro]


class OneLayerCost:
    """What the benchmark measures, as the policies' cost: one layer of `model`, no LM head
    and no per-micro-batch overhead (`CostModel.stack_cost(num_layers=1, head=False)`),
    in the separable form the scheduler prices exactly.

    The policies must balance what is measured: the head is a per-token cost (8-9% of a
    Qwen3-8B's FLOPs), and balancing it while timing a layer without it would tilt the
    comparison against the policies that count it (calibrated, FLOPs) and towards tokens.
    """

    def __init__(self, model, *, moe: bool) -> None:
        self.model = model
        self.kind = "moe" if moe else "dense"
        self.gpu, self.spec = model.gpu, model.spec
        self.modes = model.modes  # a mode without curves is refused when scheduling starts

    def fixed_cost(self, mode: str = "train") -> float:
        return float(self.model.curves[mode].layer_overhead_ms)

    def sequence_costs(self, lengths, mode: str = "train") -> np.ndarray:
        return self.model.curves[mode].attention(np.asarray(lengths, dtype=np.float64))

    def token_costs(self, tokens, mode: str = "train") -> np.ndarray:
        return self.model.curves[mode].linear[self.kind](np.asarray(tokens, dtype=np.float64))

    def microbatch_costs(self, lengths, offsets, mode: str = "train") -> np.ndarray:
        from costmodel.model import separable_microbatch_costs

        return separable_microbatch_costs(self, np.asarray(lengths), np.asarray(offsets), mode)

    def microbatch_cost(self, lengths, mode: str = "train") -> float:
        lengths = np.asarray(lengths)
        return float(self.microbatch_costs(lengths, np.array([0, lengths.size]), mode)[0])


def one_layer_flops_cost(spec, *, moe: bool, mode: str = "train"):
    """FLOPs of one layer's pass (no LM head; x 3 for "train", as `flops_cost`): the FLOPs
    policy's cost here."""
    from costmodel.flops import attention_core_flops, layer_linear_flops, pass_factor
    from costmodel.scheduler.costs import AdditiveCost

    scale = pass_factor(mode)

    def per_sample(lengths: np.ndarray) -> np.ndarray:
        return scale * (layer_linear_flops(lengths, spec, moe=moe)
                        + attention_core_flops(lengths, spec)).astype(np.float64)

    return AdditiveCost(f"{mode} FLOPs of one {spec.name} layer", per_sample)


def policy_cost(policy: str, spec, cost_model, *, moe: bool, mode: str = "train") -> Any:
    """The cost a scheduling policy balances here (not the baseline, which packs its own
    way): tokens, one layer's FLOPs, or one layer of the cost model."""
    if policy == "tokens":
        return "tokens"
    if policy == "flops":
        return one_layer_flops_cost(spec, moe=moe, mode=mode)
    if policy == "calibrated":
        if cost_model is None:
            raise ValueError("policy 'calibrated' needs a cost model (--cost-model)")
        return OneLayerCost(cost_model, moe=moe)
    raise ValueError(f"unknown policy {policy!r}; allowed: {', '.join(POLICIES)}")


def build_policy_schedules(
    lengths: np.ndarray,
    *,
    dp_size: int,
    cap: int,
    spec,
    cost_model=None,
    policies: Sequence[str] = POLICIES,
    moe: bool = False,
    mode: str = "train",
    align: int = 1,
) -> dict[str, Schedule]:
    """One schedule (rank -> micro-batches -> sample indices) per policy; the FLOPs and
    calibrated policies balance one layer's cost of a ``mode`` pass, as measured
    (`OneLayerCost`). The baseline is what frameworks run (their FLOPs, head included).
    Every policy's micro-batches per rank are a multiple of ``align``, as `simulate` builds
    them."""
    from costmodel.scheduler import build_schedule

    out: dict[str, Schedule] = {}
    for policy in policies:
        if policy == "baseline":
            out[policy] = _baseline_schedule(lengths, dp_size=dp_size, cap=cap, spec=spec,
                                             align=align)
            continue
        schedule = build_schedule(
            lengths, dp_size=dp_size, max_tokens_per_microbatch=cap,
            cost=policy_cost(policy, spec, cost_model, moe=moe, mode=mode), spec=spec,
            align=align, mode=mode,
        )
        out[policy] = _as_rank_lists(schedule)
    return out


def check_schedule(schedule: Schedule, n: int, cap: int, lengths: np.ndarray, policy: str,
                   align: int = 1) -> None:
    """Every sample once; no micro-batch over the cap unless it is one long sample alone;
    micro-batches per rank a multiple of ``align``."""
    seen = np.zeros(n, dtype=np.int64)
    for rank in schedule:
        if len(rank) % align:
            raise RuntimeError(f"policy {policy}: a rank has {len(rank)} micro-batches, not a "
                               f"multiple of align {align}")
        for mb in rank:
            seen[mb] += 1
            if len(mb) > 1 and int(lengths[mb].sum()) > cap:
                raise RuntimeError(
                    f"policy {policy}: a micro-batch of {int(lengths[mb].sum())} tokens exceeds "
                    f"the cap {cap}"
                )
    if not (seen == 1).all():
        raise RuntimeError(f"policy {policy}: a sample is missing or scheduled twice")


# ----------------------------------------------------------------------------- running
@dataclass(kw_only=True)
class PolicyRun:
    """One policy at one DP size: its schedule, predictions and measurements."""

    policy: str
    dp_size: int
    schedule: Schedule
    microbatch_lengths: list[list[list[int]]]
    measured_ms: list[float]
    """Per rank: Σ of its micro-batches' measured one-layer times."""
    predicted_ms: list[float] | None = None
    """Per rank: the cost model's prediction of the same one-layer work (None without one)."""
    predicted_own: list[float] = field(default_factory=list)
    """Per rank: the policy's own cost (tokens, FLOPs or model ms; baseline: FLOPs)."""
    slowest_rank_direct_ms: float | None = None
    """The slowest rank timed end to end (micro-batches back to back), when the measurer
    can (`LayerTimer.measure_rank`); compare with `makespan`, the sum of its parts."""
    timing_noise: float | None = None
    """Estimated relative noise of one micro-batch's measured time (`timing_noise`)."""
    noise_floor: float | None = None
    """The measured max/mean that noise alone would give a perfectly balanced schedule with
    these micro-batches (`noise_floor`): how far below it no schedule can be shown to be."""

    @property
    def makespan(self) -> float:
        return max(self.measured_ms)

    @property
    def imbalance(self) -> float:
        return _max_over_mean(self.measured_ms)

    @property
    def predicted_imbalance(self) -> float:
        return _max_over_mean(self.predicted_own)

    def to_dict(self, token_makespan: float | None) -> dict[str, Any]:
        d: dict[str, Any] = {
            "policy": self.policy,
            "dp_size": self.dp_size,
            "microbatches_per_rank": [len(r) for r in self.schedule],
            "measured_rank_ms": self.measured_ms,
            "measured_makespan_ms": self.makespan,
            "measured_max_over_mean": self.imbalance,
            "own_cost_per_rank": self.predicted_own,
            "own_cost_max_over_mean": self.predicted_imbalance,
            "speedup_over_tokens": (token_makespan / self.makespan) if token_makespan else None,
            "slowest_rank_direct_ms": self.slowest_rank_direct_ms,
            "timing_noise": self.timing_noise,
            "noise_floor_max_over_mean": self.noise_floor,
            "microbatch_lengths": self.microbatch_lengths,
        }
        if self.predicted_ms is not None:
            pred = np.asarray(self.predicted_ms)
            meas = np.asarray(self.measured_ms)
            d["predicted_rank_ms"] = self.predicted_ms
            d["predicted_makespan_ms"] = float(pred.max())
            d["predicted_max_over_mean"] = _max_over_mean(self.predicted_ms)
            d["rank_error_pct"] = ((pred / meas - 1) * 100).tolist()
            d["rank_mape_pct"] = float(np.mean(np.abs(pred / meas - 1)) * 100)
        return d


def _max_over_mean(values: Sequence[float]) -> float:
    arr = np.asarray(values, dtype=np.float64)
    mean = float(arr.mean()) if arr.size else 0.0
    return float(arr.max() / mean) if mean > 0 else 1.0


def _own_costs(policy: str, mbs: list[list[list[int]]], spec, cost_model, moe: bool,
               mode: str = "train") -> list[float]:
    """Per rank, the cost the policy balanced (the baseline: its FLOPs of a ``mode`` pass,
    head included)."""
    from costmodel.flops import calculate_fwd_flops, pass_factor
    from costmodel.scheduler.costs import as_cost

    if policy == "baseline":
        passes = int(pass_factor(mode))  # exact integers, as calculate_train_flops
        return [float(sum(passes * calculate_fwd_flops(mb, spec) for mb in rank)) for rank in mbs]
    cost = as_cost(policy_cost(policy, spec, cost_model, moe=moe, mode=mode), spec, mode)
    return [float(sum(cost.microbatch_cost(mb) for mb in rank)) for rank in mbs]


class PlannedRun(NamedTuple):
    """One (policy, DP size) schedule to measure: its micro-batches as lists of lengths."""

    policy: str
    dp_size: int
    schedule: Schedule
    microbatch_lengths: list[list[list[int]]]


Planned = list[PlannedRun]


def plan_benchmark(
    lengths: np.ndarray,
    *,
    spec,
    cap: int,
    dp_sizes: Sequence[int],
    cost_model=None,
    policies: Sequence[str] = POLICIES,
    lengths_for_dp: Callable[[int], np.ndarray] | None = None,
    moe_layer: bool | None = None,
    mode: str = "train",
    align: int = 1,
) -> Planned:
    """Every (policy, dp, schedule, micro-batch lengths) to measure, built and checked on
    the CPU: a bad cap, DP size, align or batch fails here, before a GPU is touched."""
    from costmodel.checks import positive_int
    from costmodel.curves import checked_mode

    checked_mode(mode)
    align = positive_int(align, "align")
    if cap < 1:
        raise ValueError(f"the token cap must be at least 1, got {cap}")
    if "calibrated" in policies and cost_model is None:
        raise ValueError("policy 'calibrated' needs a cost model: pass --cost-model")
    moe = spec.is_moe if moe_layer is None else moe_layer
    planned: Planned = []
    for dp in dp_sizes:
        batch = lengths if lengths_for_dp is None else lengths_for_dp(dp)
        if dp < 1:
            raise ValueError(f"DP sizes must be at least 1, got {dp}")
        if dp * align > batch.size:  # no micro-batch may be empty
            if align == 1:
                what, needs, smaller = f"DP size {dp}", "every rank needs one", "--dp"
            else:
                what = f"DP size {dp} x align {align} (micro-batches per rank)"
                needs, smaller = "every micro-batch needs one", "--dp or --align"
            raise ValueError(
                f"{what} is larger than the {batch.size} samples in the batch: {needs}; use "
                f"more samples (--samples / --samples-per-rank) or smaller {smaller}"
            )
        schedules = build_policy_schedules(
            batch, dp_size=dp, cap=cap, spec=spec, cost_model=cost_model, policies=policies,
            moe=moe, mode=mode, align=align,
        )
        for policy, sched in schedules.items():
            check_schedule(sched, batch.size, cap, batch, policy, align)
            mbs = [[[int(batch[i]) for i in mb] for mb in rank] for rank in sched]
            planned.append(PlannedRun(policy, dp, sched, mbs))
    return planned


def _measuring_order(planned: Planned) -> list[tuple[int, ...]]:
    """The micro-batches to measure, DP size by DP size (a run stopped early has whole DP
    sizes), each DP size's policies interleaved micro-batch by micro-batch: GPU clocks
    drift over a block, and policy after policy the first would be timed on cooler clocks
    than the last (the reversed second round may not get that far)."""
    keys: list[tuple[int, ...]] = []
    for dp in dict.fromkeys(run.dp_size for run in planned):
        per_policy = [[microbatch_key(mb) for rank in run.microbatch_lengths for mb in rank]
                      for run in planned if run.dp_size == dp]
        keys += [k for group in zip_longest(*per_policy) for k in group if k is not None]
    return keys


class MeasurementFailed(RuntimeError):
    """Measuring stopped on an error; ``runs`` holds the schedules measured in full before."""

    def __init__(self, message: str, runs: list[PolicyRun]):
        super().__init__(message)
        self.runs = runs


def measure_benchmark(
    planned: Planned,
    *,
    measure: Measure,
    spec,
    cost_model=None,
    repeats: int = 2,
    warmup: int = 2,
    moe_layer: bool | None = None,
    progress: Callable[[str], None] | None = None,
    deadline: float | None = None,
    mode: str = "train",
) -> list[PolicyRun]:
    """Measure the micro-batches of `plan_benchmark`'s schedules and sum them per rank;
    predictions and own costs are of a ``mode`` pass, the one the schedules were built for.

    An error while measuring, or while timing a whole rank end to end (its per-micro-batch
    results are then complete), raises `MeasurementFailed` carrying the runs measured in
    full, so that a caller can still report them: a failure all the same."""
    timed = getattr(measure, "mode", mode)  # a LayerTimer says which pass it times
    if timed != mode:
        raise ValueError(f"the measurer times {timed!r} passes but the schedules are judged "
                         f"in mode {mode!r}: build the timer with mode={mode!r}")
    moe = spec.is_moe if moe_layer is None else moe_layer
    keys = _measuring_order(planned)
    if progress is not None:
        distinct = set(keys)
        progress(
            f"{len(planned)} schedules, {len(keys)} micro-batches ({len(distinct)} distinct, "
            f"{sum(sum(k) for k in distinct)} tokens) x {repeats} rounds to measure"
        )
    times, stopped, noise = measure_microbatches(
        keys, measure, repeats=repeats, warmup=warmup, progress=progress, deadline=deadline
    )
    if stopped:
        deadline = 0.0  # no end-to-end rank timings either: report what was measured
    failure = stopped if stopped is not None and stopped.startswith("error") else None
    runs = []
    for policy, dp, sched, mbs in planned:
        if any(microbatch_key(mb) not in times for rank in mbs for mb in rank):
            continue  # stopped before all of it was measured
        measured = [float(sum(times[microbatch_key(mb)] for mb in rank)) for rank in mbs]
        floor = None
        if noise is not None:
            floor = noise_floor([[times[microbatch_key(mb)] for mb in rank] for rank in mbs], noise)
        predicted = None
        if cost_model is not None:
            predicted = [
                float(sum(cost_model.stack_cost(mb, mode, num_layers=1, moe=moe, head=False)
                          for mb in rank))
                for rank in mbs
            ]
        direct = None
        measure_rank = getattr(measure, "measure_rank", None)
        if measure_rank is not None and (deadline is None or time.perf_counter() < deadline):
            slowest = int(np.argmax(measured))
            try:
                direct = float(np.median([measure_rank(mbs[slowest]) for _ in range(repeats)]))
            except KeyboardInterrupt:
                deadline = 0.0  # no more end-to-end timings; report what was measured
                logger.warning("interrupted: skipping the remaining end-to-end rank timings")
            except Exception as err:  # a whole rank in one span (or graph): out of memory?
                deadline = 0.0
                failure = (f"error: {type(err).__name__}: {err} (timing rank {slowest} of "
                           f"{policy}, dp {dp} end to end)")
                logger.warning("%s; skipping the remaining end-to-end rank timings", failure,
                               exc_info=True)
        runs.append(
            PolicyRun(
                policy=policy, dp_size=dp, schedule=sched, microbatch_lengths=mbs,
                measured_ms=measured, predicted_ms=predicted,
                predicted_own=_own_costs(policy, mbs, spec, cost_model, moe, mode),
                slowest_rank_direct_ms=direct, timing_noise=noise, noise_floor=floor,
            )
        )
    if failure is not None:
        raise MeasurementFailed(f"measuring stopped on an {failure}", runs)
    return runs
