"""`costmodel bench-schedule`: what each scheduling policy buys in *measured* step time.

For a batch of lengths, a model, a token cap and each DP size, build one schedule per
policy —

- ``tokens``: balance Σ tokens (classic dynamic batching),
- ``flops``: balance exact analytic FLOPs (of one layer, as measured: `OneLayerCost`),
- ``baseline``: what RL frameworks run today: first-fit packing by tokens, then
  Karmarkar-Karp over micro-batch FLOPs to ranks (`costmodel.scheduler.baselines`),
- ``calibrated``: balance the predicted time of a calibrated cost model (one layer),

then time every simulated rank by running its micro-batches, forward and backward, through
one real layer (`costmodel.kernels.layer.TransformerLayer`) on one GPU, rank after rank.
A rank's time is the sum of its micro-batches' times; the step's makespan is the slowest
rank. One layer stands for the model: every layer of a dense model does the same work,
and the per-rank sums compare policies on equal terms.

The measurement is injectable: ``measure(lengths) -> ms`` times one micro-batch. Each
distinct micro-batch (as a sorted multiset of lengths) is timed once per round, and the
rounds are interleaved (round 1 over all micro-batches, then round 2 in reverse, then
shuffled) so slow drift favours no policy and no rank; the median over rounds is kept.
CPU tests pass a fake measurer.

Numpy only, except `LayerTimer` (torch, imported when it is built).
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "POLICIES",
    "LayerTimer",
    "OneLayerCost",
    "PolicyRun",
    "build_policy_schedules",
    "format_report",
    "run_benchmark",
]

logger = logging.getLogger(__name__)

POLICIES: tuple[str, ...] = ("tokens", "flops", "baseline", "calibrated")

Measure = Callable[[Sequence[int]], float]
Schedule = list[list[list[int]]]  # rank -> micro-batch -> global sample indices


# ----------------------------------------------------------------------------- schedules
def _baseline_schedule(lengths: np.ndarray, *, dp_size: int, cap: int, spec) -> Schedule:
    """First-fit by tokens, then Karmarkar-Karp over micro-batch FLOPs to ranks."""
    from costmodel.scheduler import baselines

    result = baselines.first_fit_then_karmarkar_karp(
        lengths, dp_size=dp_size, max_tokens_per_microbatch=cap, spec=spec
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


def one_layer_flops_cost(spec, *, moe: bool):
    """Training FLOPs of one layer (no LM head): the FLOPs policy's cost here."""
    from costmodel.flops import attention_core_flops, layer_linear_flops
    from costmodel.scheduler.costs import AdditiveCost

    def per_sample(lengths: np.ndarray) -> np.ndarray:
        return 3.0 * (layer_linear_flops(lengths, spec, moe=moe)
                      + attention_core_flops(lengths, spec)).astype(np.float64)

    return AdditiveCost(f"train FLOPs of one {spec.name} layer", per_sample)


def policy_cost(policy: str, spec, cost_model, *, moe: bool) -> Any:
    """The cost a scheduling policy balances here (not the baseline, which packs its own
    way): tokens, one layer's FLOPs, or one layer of the cost model."""
    if policy == "tokens":
        return "tokens"
    if policy == "flops":
        return one_layer_flops_cost(spec, moe=moe)
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
) -> dict[str, Schedule]:
    """One schedule (rank -> micro-batches -> sample indices) per policy; the FLOPs and
    calibrated policies balance one layer's cost, as measured (`OneLayerCost`). The baseline
    is what frameworks run (their FLOPs, head included)."""
    from costmodel.scheduler import build_schedule

    out: dict[str, Schedule] = {}
    for policy in policies:
        if policy == "baseline":
            out[policy] = _baseline_schedule(lengths, dp_size=dp_size, cap=cap, spec=spec)
            continue
        schedule = build_schedule(
            lengths, dp_size=dp_size, max_tokens_per_microbatch=cap,
            cost=policy_cost(policy, spec, cost_model, moe=moe), spec=spec,
        )
        out[policy] = _as_rank_lists(schedule)
    return out


def check_schedule(schedule: Schedule, n: int, cap: int, lengths: np.ndarray, policy: str) -> None:
    """Every sample once; no micro-batch over the cap unless it is one long sample alone."""
    seen = np.zeros(n, dtype=np.int64)
    for rank in schedule:
        for mb in rank:
            seen[mb] += 1
            if len(mb) > 1 and int(lengths[mb].sum()) > cap:
                raise RuntimeError(
                    f"policy {policy}: a micro-batch of {int(lengths[mb].sum())} tokens exceeds "
                    f"the cap {cap}"
                )
    if not (seen == 1).all():
        raise RuntimeError(f"policy {policy}: a sample is missing or scheduled twice")


# ---------------------------------------------------------------------------- measuring
def _key(lengths: Sequence[int]) -> tuple[int, ...]:
    return tuple(sorted(int(x) for x in lengths))


class _TimeLimit(Exception):
    """The deadline passed (raised and caught inside `measure_microbatches`)."""


def measure_microbatches(
    keys: Sequence[tuple[int, ...]],
    measure: Measure,
    *,
    repeats: int = 2,
    warmup: int = 2,
    progress: Callable[[str], None] | None = None,
    deadline: float | None = None,
) -> tuple[dict[tuple[int, ...], float], str | None, float | None]:
    """Median over ``repeats`` interleaved rounds of ``measure`` for each distinct key.

    The first round measures keys in the order they first appear, so a run stopped early
    (at ``deadline``, a `time.perf_counter` value, or by Ctrl-C / SIGINT) has measured
    whole schedules of the first DP sizes and policies. Later rounds run in other orders
    (`round_order`) so that GPU clock drift, which hits the keys measured close together
    in time — one rank's micro-batches — lands on different keys each round. Keys never
    measured are absent from the result; a key measured in fewer rounds keeps the median
    of those it has. Returns the medians, why measuring stopped early (None when every
    round finished), and the timing noise (`timing_noise`; None with fewer than 2 rounds).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    distinct = list(dict.fromkeys(keys))
    if not distinct:
        return {}, None, None
    stopped = None
    samples: dict[tuple[int, ...], list[float]] = {k: [] for k in distinct}
    start = time.perf_counter()
    try:
        # Warm-up on the largest and the smallest micro-batch: autotuning, allocator growth.
        by_size = sorted(distinct, key=lambda k: (-sum(k), k))
        for k in (by_size[:warmup] + by_size[-warmup:]) if warmup > 0 else []:
            measure(k)
        for r in range(repeats):
            for k in round_order(distinct, r):
                if deadline is not None and time.perf_counter() > deadline:
                    raise _TimeLimit
                ms = float(measure(k))
                if not np.isfinite(ms) or ms < 0:
                    raise RuntimeError(
                        f"the measurer returned {ms} ms for a micro-batch of {len(k)} samples"
                    )
                samples[k].append(ms)
            if progress is not None:
                progress(
                    f"round {r + 1}/{repeats}: {len(distinct)} micro-batches, "
                    f"{time.perf_counter() - start:.1f} s so far"
                )
    except (_TimeLimit, KeyboardInterrupt) as err:
        done = sum(1 for v in samples.values() if v)
        stopped = "interrupted" if isinstance(err, KeyboardInterrupt) else "time limit reached"
        logger.warning(
            "%s after %.1f s: keeping what was measured (%d of %d micro-batches at least once)",
            stopped, time.perf_counter() - start, done, len(distinct),
        )
    medians = {k: float(np.median(v)) for k, v in samples.items() if v}
    return medians, stopped, timing_noise(samples)


def round_order(keys: list[tuple[int, ...]], round_index: int) -> list[tuple[int, ...]]:
    """The order of round `round_index`: as given, then reversed (with the first round,
    linear drift cancels in each key's mean), then seeded shuffles (a burst of slow clocks
    hits unrelated keys). The same in every run."""
    if round_index == 0:
        return list(keys)
    if round_index == 1:
        return keys[::-1]
    order = np.random.default_rng(round_index).permutation(len(keys))
    return [keys[i] for i in order]


# Standard deviation of the median of r normal samples, in units of one sample's sigma
# (r = 2: the mean of two; larger r: about sqrt(pi / (2 r))).
_MEDIAN_SD = {1: 1.0, 2: 0.7071, 3: 0.6698, 4: 0.5445, 5: 0.5357}


def timing_noise(samples: dict[tuple[int, ...], list[float]]) -> float | None:
    """Relative standard deviation of one reported (median) micro-batch time, estimated
    from the rounds: per key, the relative difference of its first two samples; their
    median over keys (robust to the odd outlier) gives one sample's sigma (|a − b| of two
    normal samples has median 0.6745·√2·σ); times the sd of a median of r samples. An
    estimate; None without 2 rounds."""
    diffs, rounds = [], []
    for v in samples.values():
        if len(v) >= 2:
            a, b = float(v[0]), float(v[1])
            diffs.append(abs(a - b) / ((a + b) / 2))
            rounds.append(len(v))
    if not diffs:
        return None
    sigma = float(np.median(diffs)) / (0.6745 * math.sqrt(2))
    r = int(np.median(rounds))
    return sigma * _MEDIAN_SD.get(r, math.sqrt(math.pi / (2 * r)))


def noise_floor(microbatch_ms: Sequence[Sequence[float]], noise: float, *,
                draws: int = 400, seed: int = 0) -> float:
    """Expected measured max/mean of a *perfectly* balanced schedule with these ranks'
    micro-batch structure, when each micro-batch's time carries relative noise `noise`:
    each rank's micro-batches are rescaled to the mean rank time, then noised."""
    ranks = [np.asarray(r, dtype=np.float64) for r in microbatch_ms]
    mean = float(np.mean([r.sum() for r in ranks]))
    scaled = [r * (mean / r.sum()) if r.sum() > 0 else r for r in ranks]
    rng = np.random.default_rng(seed)
    sums = np.stack([(r[None, :] * (1 + noise * rng.standard_normal((draws, r.size)))).sum(1)
                     for r in scaled], axis=1)
    return float(np.mean(sums.max(axis=1) / sums.mean(axis=1)))


class LayerTimer:
    """Times micro-batches, forward + backward, through one `TransformerLayer` on a GPU.

    ``__call__(lengths) -> ms`` times one micro-batch; `measure_rank` times a rank's
    micro-batches back to back. ``timing="eager"`` (default) times plain calls, as a
    training step runs them; the first call also runs once untimed (CUDA context, cuBLAS
    handles). ``timing="graph"`` captures each micro-batch into a CUDA graph and times
    replays: the GPU's own time, the median of ``replays``.
    Without a CUDA GPU it raises RuntimeError, unless ``device="cpu"`` is asked for
    explicitly (tests: wall-clock time, the same code path otherwise).
    """

    def __init__(
        self, spec, *, attention: str = "torch-varlen", dtype: str = "bf16", seed: int = 0,
        device: str | None = None, timing: str = "eager", replays: int = 3,
    ):
        try:
            import torch
        except ImportError:
            raise RuntimeError(
                "bench-schedule times micro-batches on a GPU and needs torch: "
                "pip install 'costmodel[gpu]'"
            ) from None
        if device is None and not torch.cuda.is_available():
            raise RuntimeError(
                "bench-schedule times micro-batches on a CUDA GPU and none is visible "
                f"(torch {torch.__version__}, CUDA {torch.version.cuda}); run it on a GPU machine"
            )
        from costmodel.calibration.timer import check_timing

        check_timing(timing)
        if replays < 1:
            raise ValueError(f"replays must be at least 1, got {replays}")
        from costmodel.kernels.layer import TransformerLayer

        self._torch = torch
        torch.manual_seed(seed)
        self.spec = spec
        if device is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.timing = timing if self.cuda else "eager"
        self.replays = replays
        self._warm = False
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        self.layer = TransformerLayer(spec, attention=attention, device=self.device, dtype=self.dtype)
        self.layer.check_values = False  # inputs come from packed_inputs: no host syncs
        self.is_moe = self.layer.is_moe
        self.attention = attention

    def _step(self, lengths: Sequence[int]) -> Callable[[], None]:
        """fwd+bwd of one micro-batch of fresh random inputs, as a callable."""
        from costmodel.kernels.layer import packed_inputs

        x, cu, max_len = packed_inputs(
            [int(n) for n in lengths], self.spec, device=self.device, dtype=self.dtype,
            requires_grad=True,
        )
        grad = self._torch.randn_like(x)

        def step() -> None:
            x.grad = None  # written fresh each call, not accumulated (as KernelTimer does)
            self.layer(x, cu, max_len).backward(grad)

        return step

    def _span(self, steps: Sequence[Callable[[], None]]) -> float:
        """One timed span (ms) running each step in turn."""
        torch = self._torch
        if not self.cuda:
            t0 = time.perf_counter()
            for step in steps:
                step()
            return (time.perf_counter() - t0) * 1e3
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for step in steps:
            step()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))

    def _time(self, microbatches: Sequence[Sequence[int]]) -> float:
        steps = [self._step(mb) for mb in microbatches]
        if self.timing == "graph":
            from costmodel.calibration.timer import capture_cuda_graph

            # One graph for the whole span: its micro-batches share one memory pool (a
            # graph each would hold every micro-batch's working memory at once).
            graph = capture_cuda_graph(lambda: [step() for step in steps], warmup=1)
            return float(np.median([self._span([graph.replay]) for _ in range(self.replays)]))
        if not self._warm:
            for step in steps:
                step()
            self._warm = True
        return self._span(steps)

    def __call__(self, lengths: Sequence[int]) -> float:
        return self._time([lengths])

    def measure_rank(self, microbatches: Sequence[Sequence[int]]) -> float:
        """One rank end to end: its micro-batches back to back in one timed span.

        A check on the per-micro-batch sums (`run_benchmark` records both for the slowest
        rank of each schedule): eagerly, one micro-batch's launch tail overlaps the next
        one's start, so the direct time can be slightly lower than the sum.
        """
        return self._time(microbatches)

    def describe(self) -> dict[str, Any]:
        torch = self._torch
        if not self.cuda:
            return {"measurer": f"one TransformerLayer on {self.device} (wall clock)",
                    "torch": torch.__version__, "attention": self.attention}
        props = torch.cuda.get_device_properties(self.device)
        return {
            "measurer": "one TransformerLayer, forward+backward, CUDA events",
            "timing": self.timing,
            "replays": self.replays if self.timing == "graph" else None,
            "gpu": torch.cuda.get_device_name(self.device),
            "sm_count": props.multi_processor_count,
            "compute_capability": f"{props.major}.{props.minor}",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "attention": self.attention,
            "dtype": str(self.dtype).replace("torch.", ""),
            "moe_layer": self.is_moe,
        }


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


def _own_costs(policy: str, mbs: list[list[list[int]]], spec, cost_model, moe: bool) -> list[float]:
    """Per rank, the cost the policy balanced (the baseline: its FLOPs, head included)."""
    from costmodel.flops import calculate_train_flops
    from costmodel.scheduler.costs import as_cost

    if policy == "baseline":
        return [float(sum(calculate_train_flops(mb, spec) for mb in rank)) for rank in mbs]
    cost = as_cost(policy_cost(policy, spec, cost_model, moe=moe), spec)
    return [float(sum(cost.microbatch_cost(mb) for mb in rank)) for rank in mbs]


def run_benchmark(
    lengths: np.ndarray,
    *,
    spec,
    cap: int,
    dp_sizes: Sequence[int],
    measure: Measure,
    cost_model=None,
    policies: Sequence[str] = POLICIES,
    lengths_for_dp: Callable[[int], np.ndarray] | None = None,
    repeats: int = 2,
    warmup: int = 2,
    moe_layer: bool | None = None,
    progress: Callable[[str], None] | None = None,
    deadline: float | None = None,
) -> list[PolicyRun]:
    """Build every (dp, policy) schedule, measure every distinct micro-batch, sum per rank.

    ``lengths_for_dp(dp)`` gives the batch for a DP size (default: ``lengths`` for all).
    All schedules are built and checked before the first measurement (`plan_benchmark`).
    Measuring stops at ``deadline`` (a `time.perf_counter` value) or on Ctrl-C; only the
    (dp, policy) runs whose every micro-batch was measured are returned, in order.
    """
    planned = plan_benchmark(
        lengths, spec=spec, cap=cap, dp_sizes=dp_sizes, cost_model=cost_model,
        policies=policies, lengths_for_dp=lengths_for_dp, moe_layer=moe_layer,
    )
    return measure_benchmark(
        planned, measure=measure, spec=spec, cost_model=cost_model, repeats=repeats,
        warmup=warmup, moe_layer=moe_layer, progress=progress, deadline=deadline,
    )


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
) -> Planned:
    """Every (policy, dp, schedule, micro-batch lengths) to measure, built and checked on
    the CPU: a bad cap, DP size or batch fails here, before a GPU is touched."""
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
        if dp > batch.size:
            raise ValueError(
                f"DP size {dp} is larger than the {batch.size} samples in the batch: every rank "
                f"needs one; use more samples (--samples / --samples-per-rank) or smaller --dp"
            )
        schedules = build_policy_schedules(
            batch, dp_size=dp, cap=cap, spec=spec, cost_model=cost_model, policies=policies,
            moe=moe,
        )
        for policy, sched in schedules.items():
            check_schedule(sched, batch.size, cap, batch, policy)
            mbs = [[[int(batch[i]) for i in mb] for mb in rank] for rank in sched]
            planned.append(PlannedRun(policy, dp, sched, mbs))
    return planned


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
) -> list[PolicyRun]:
    """Measure the micro-batches of `plan_benchmark`'s schedules and sum them per rank."""
    moe = spec.is_moe if moe_layer is None else moe_layer
    keys = [_key(mb) for run in planned for rank in run.microbatch_lengths for mb in rank]
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
    runs = []
    for policy, dp, sched, mbs in planned:
        if any(_key(mb) not in times for rank in mbs for mb in rank):
            continue  # stopped before all of it was measured
        measured = [float(sum(times[_key(mb)] for mb in rank)) for rank in mbs]
        floor = None
        if noise is not None:
            floor = noise_floor([[times[_key(mb)] for mb in rank] for rank in mbs], noise)
        predicted = None
        if cost_model is not None:
            predicted = [
                float(sum(cost_model.stack_cost(mb, num_layers=1, moe=moe, head=False) for mb in rank))
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
        runs.append(
            PolicyRun(
                policy=policy, dp_size=dp, schedule=sched, microbatch_lengths=mbs,
                measured_ms=measured, predicted_ms=predicted,
                predicted_own=_own_costs(policy, mbs, spec, cost_model, moe),
                slowest_rank_direct_ms=direct, timing_noise=noise, noise_floor=floor,
            )
        )
    return runs


# ------------------------------------------------------------------------------ report
def token_makespans(runs: Sequence[PolicyRun]) -> dict[int, float]:
    return {r.dp_size: r.makespan for r in runs if r.policy == "tokens"}


def format_report(runs: Sequence[PolicyRun], *, per_rank: bool = False) -> str:
    """The table `bench-schedule` prints."""
    base = token_makespans(runs)
    lines = [
        f"{'dp':>4} {'policy':<11} {'mb/rank':>7} {'makespan ms':>11} {'max/mean':>8} "
        f"{'speed-up':>8} {'pred max/mean':>13} {'rank err %':>10}",
    ]
    for r in runs:
        speed = f"{base[r.dp_size] / r.makespan:.3f}x" if r.dp_size in base else "-"
        mb = len(r.schedule[0]) if r.schedule else 0
        err = "-"
        if r.predicted_ms is not None:
            e = np.abs(np.asarray(r.predicted_ms) / np.asarray(r.measured_ms) - 1) * 100
            err = f"{e.mean():.1f}/{e.max():.1f}"
        lines.append(
            f"{r.dp_size:>4} {r.policy:<11} {mb:>7} {r.makespan:>11.2f} {r.imbalance:>8.3f} "
            f"{speed:>8} {r.predicted_imbalance:>13.3f} {err:>10}"
        )
    lines.append(
        "makespan: slowest rank's Σ of one layer's fwd+bwd time over its micro-batches; "
        "speed-up: token balance's makespan / this one's; pred max/mean: by the policy's own "
        "cost; rank err %: |cost-model prediction / measured - 1| per rank, mean/worst"
    )
    floors = {r.dp_size: r for r in runs if r.policy == "calibrated" and r.noise_floor}
    for dp, r in sorted(floors.items()):
        lines.append(
            f"dp {dp}: timing noise ~{100 * r.timing_noise:.1f}% per micro-batch; a perfectly "
            f"balanced schedule of the calibrated policy's micro-batches would measure max/mean "
            f"~{r.noise_floor:.3f}"
        )
    ratios = [r.slowest_rank_direct_ms / r.makespan for r in runs if r.slowest_rank_direct_ms]
    if ratios:
        lines.append(
            f"slowest rank timed end to end / sum of its micro-batches: {min(ratios):.3f} to "
            f"{max(ratios):.3f} over {len(ratios)} schedules"
        )
    if per_rank:
        for r in runs:
            if r.predicted_ms is None:
                continue
            lines.append(f"dp {r.dp_size} {r.policy}: rank predicted ms / measured ms")
            lines.extend(
                f"  rank {i:>3}: {p:9.2f} / {m:9.2f}  ({(p / m - 1) * 100:+.1f}%)"
                for i, (p, m) in enumerate(zip(r.predicted_ms, r.measured_ms))
            )
    return "\n".join(lines)


def target_checks(runs: Sequence[PolicyRun]) -> list[dict[str, Any]]:
    """The issue's targets per DP size: calibrated ≥10% below tokens, ≤ flops, max/mean < 1.03."""
    by = {(r.dp_size, r.policy): r for r in runs}
    out = []
    for dp in sorted({r.dp_size for r in runs}):
        cal, tok, flo = by.get((dp, "calibrated")), by.get((dp, "tokens")), by.get((dp, "flops"))
        if cal is None:
            continue
        row: dict[str, Any] = {"dp_size": dp, "calibrated_max_over_mean": cal.imbalance,
                               "max_over_mean_below_1.03": cal.imbalance < 1.03,
                               "noise_floor_max_over_mean": cal.noise_floor}
        if tok is not None:
            cut = 1 - cal.makespan / tok.makespan
            row["makespan_cut_vs_tokens"] = cut
            row["cut_at_least_10pct"] = cut >= 0.10
        if flo is not None:
            row["no_worse_than_flops"] = cal.makespan <= flo.makespan
        out.append(row)
    return out


def provenance(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Who ran what, where and when (no GPU query here; the measurer adds its own)."""
    import costmodel

    commit = None
    root = Path(__file__).resolve().parents[2]
    if (root / ".git").exists():
        try:
            commit = subprocess.run(
                ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                timeout=5, check=False,
            ).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            commit = None
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "command": " ".join(["costmodel", *(argv if argv is not None else sys.argv[1:])]),
        "costmodel": getattr(costmodel, "__version__", None),
        "git_commit": commit,
        "python": platform.python_version(),
        "numpy": np.__version__,
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
    }
