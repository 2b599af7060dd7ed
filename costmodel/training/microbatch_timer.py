"""Timing micro-batches for `costmodel bench-schedule`.

`measure_microbatches` times each distinct micro-batch (a sorted tuple of lengths,
`microbatch_key`) once per round, in interleaved rounds (`round_order`) so that slow clock
drift favours no policy and no rank, and keeps the median; `timing_noise` and
`noise_floor` say how much of a measured imbalance noise alone would explain. `LayerTimer`
is the measurer on a GPU: one real `TransformerLayer`, forward + backward or forward only.

Numpy only, except `LayerTimer` (torch, imported when it is built).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from costmodel.checks import import_torch
from costmodel.curves import checked_mode
from costmodel.kernels import TRITON_VARIANT_LENGTHS

__all__ = [
    "PASSES",
    "LayerTimer",
    "Measure",
    "measure_microbatches",
    "microbatch_key",
    "noise_floor",
    "round_order",
    "timing_noise",
]

logger = logging.getLogger(__name__)

Measure = Callable[[Sequence[int]], float]
# What `LayerTimer` runs per micro-batch in each mode (calibration's pass for those curves).
PASSES = {"train": "forward+backward", "forward": "forward only, under no_grad"}


def microbatch_key(lengths: Sequence[int]) -> tuple[int, ...]:
    """A micro-batch as a sorted tuple of lengths: the same work whatever the order."""
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
    (at ``deadline``, a `time.perf_counter` value, or by Ctrl-C / SIGINT) has measured the
    keys given first in full (`bench` gives them DP size by DP size). Later rounds run in
    other orders (`round_order`) so that GPU clock drift, which hits the keys measured close
    together in time — one rank's micro-batches — lands on different keys each round. Keys never
    measured are absent from the result; a key measured in fewer rounds keeps the median
    of those it has. Returns the medians, why measuring stopped early (None when every
    round finished; "error: ..." when the measurer raised: what it measured before is
    kept), and the timing noise (`timing_noise`; None with fewer than 2 rounds).
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
    except (KeyboardInterrupt, Exception) as err:  # Exception: _TimeLimit, or a failure
        # An error (a CUDA one, out of memory) keeps what was measured too: a GPU session
        # gets one try. `stopped` then starts with "error:", and callers say it failed.
        done = sum(1 for v in samples.values() if v)
        if isinstance(err, KeyboardInterrupt):
            stopped = "interrupted"
        elif isinstance(err, _TimeLimit):
            stopped = "time limit reached"
        else:
            stopped = f"error: {type(err).__name__}: {err}"
        logger.warning(
            "%s after %.1f s: keeping what was measured (%d of %d micro-batches at least once)",
            stopped, time.perf_counter() - start, done, len(distinct),
            exc_info=stopped.startswith("error"),
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
    """Times micro-batches through one `TransformerLayer` on a GPU: forward + backward
    (``mode="train"``) or forward under no_grad (``mode="forward"``, a log-prob pass), the
    pass calibration times for that mode's curves (`calibration.workloads.packed_pass`).

    ``__call__(lengths) -> ms`` times one micro-batch; `measure_rank` times a rank's
    micro-batches back to back. ``timing="eager"`` (default) times plain calls, as a
    training step runs them; the first call also runs once untimed (CUDA context, cuBLAS
    handles), and so does any call with a micro-batch larger than every one before it
    (allocator growth). ``timing="graph"`` captures each micro-batch into a CUDA graph and times
    replays: the GPU's own time, the median of ``replays``.
    Without a CUDA GPU it raises RuntimeError, unless ``device="cpu"`` is asked for
    explicitly (tests: wall-clock time, the same code path otherwise).
    """

    def __init__(
        self, spec, *, attention: str = "torch-varlen", dtype: str = "bf16", seed: int = 0,
        device: str | None = None, timing: str = "eager", replays: int = 3, mode: str = "train",
    ):
        self.mode = checked_mode(mode)  # before torch, and before any GPU work
        torch = import_torch("bench-schedule (timing micro-batches on a GPU)")
        if device is None and not torch.cuda.is_available():
            raise RuntimeError(
                "bench-schedule times micro-batches on a CUDA GPU and none is visible "
                f"(torch {torch.__version__}, CUDA {torch.version.cuda}); run it on a GPU machine"
            )
        from costmodel.calibration.timer import timing_for

        timing = timing_for(timing, attention)
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
        self._warm_tokens = 0  # the largest micro-batch (tokens) run untimed so far
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        self.layer = TransformerLayer(spec, attention=attention, device=self.device, dtype=self.dtype)
        self.layer.check_values = False  # inputs come from packed_inputs: no host syncs
        self.is_moe = self.layer.is_moe
        self.attention = attention

    def _step(self, lengths: Sequence[int]) -> Callable[[], None]:
        """One micro-batch of fresh random inputs in this timer's mode, as a callable."""
        from costmodel.calibration.workloads import packed_pass

        step, _ = packed_pass([self.layer], lengths, self.spec, mode=self.mode,
                              device=self.device, dtype=self.dtype)
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
        tokens = max(sum(int(n) for n in mb) for mb in microbatches)
        if not self._warm:
            # Triton compiles a kernel variant per integer-argument class (a token count
            # divisible by 16 or not): both are built here, not inside a timed span (a
            # bench-only session on a fresh machine measured a compile of ~0.1-0.8 s there).
            for step in [*steps, *(self._step(mb) for mb in TRITON_VARIANT_LENGTHS)]:
                step()
            self._warm, self._warm_tokens = True, tokens
        if tokens > self._warm_tokens:
            # A micro-batch larger than any run so far grows the caching allocator
            # (cudaMalloc, GBs at 16k tokens): once, untimed, so the timed call finds it.
            for step in steps:
                step()
            self._warm_tokens = tokens
        return self._span(steps)

    def __call__(self, lengths: Sequence[int]) -> float:
        return self._time([lengths])

    def measure_rank(self, microbatches: Sequence[Sequence[int]]) -> float:
        """One rank end to end: its micro-batches back to back in one timed span.

        A check on the per-micro-batch sums (`bench.measure_benchmark` records both for the slowest
        rank of each schedule): eagerly, one micro-batch's launch tail overlaps the next
        one's start, so the direct time can be slightly lower than the sum.
        """
        return self._time(microbatches)

    def describe(self) -> dict[str, Any]:
        torch = self._torch
        if not self.cuda:
            return {"measurer": f"one TransformerLayer, {PASSES[self.mode]}, on {self.device} "
                                "(wall clock)", "mode": self.mode, "torch": torch.__version__, "attention": self.attention}
        props = torch.cuda.get_device_properties(self.device)
        return {
            "measurer": f"one TransformerLayer, {PASSES[self.mode]}, CUDA events",
            "mode": self.mode,
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
