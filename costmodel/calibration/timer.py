"""Timers: the CUDA-event timer, the `Timer` protocol the pipeline talks to, and a
synthetic timer of known shape for CPU tests.

The calibration pipeline only ever calls `timer.measure(point)` and
`timer.device_fingerprint()`: on the GPU the timer builds the workload for the point
(`costmodel.calibration.workloads`) and times it with `time_cuda`; in tests a
`SyntheticTimer` returns a known function of the point plus noise. Everything after
(fit, FLOPs check, file, report) is the same code.

`time_cuda(fn, graph=...)`:
- warm-up calls first (autotuning, compilation and allocator growth stay out);
- graph=True (what `costmodel calibrate` does by default): the warm-up runs on a side
  stream, one call is captured into a CUDA graph, and the repeats replay the graph. That
  times the GPU's own work: no Python or launch overhead, which depends on the host and
  the training framework rather than the GPU, overlaps GPU work in any step that keeps
  the GPU busy, and is the main source of noise on small workloads (eager timings of the
  same 768-token micro-batch ranged over ±25% on an H200 VM);
- graph=False (eager): the repeats call `fn`, enqueued back to back (the host runs ahead
  of the device, so a launch-bound workload measures its launch rate);
- every repeat is bracketed by its own pair of CUDA events;
- where the workload's data would fit in L2, a buffer twice the L2 size is zeroed
  between repeats (outside the events) so no repeat finds its inputs cached;
- median and relative spread ((p90 − p10) / median) over the repeats.
Torch is imported inside functions only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

import costmodel
from costmodel.calibration.plan import SweepPoint

logger = logging.getLogger(__name__)

__all__ = [
    "TIMINGS", "GraphCaptureError", "Measurement", "SyntheticShape", "SyntheticTimer", "Timer",
    "capture_cuda_graph", "check_timing", "time_cpu", "time_cuda", "timing_for",
]

#: How a workload is timed on the GPU: replays of a captured CUDA graph, or eager calls.
TIMINGS = ("graph", "eager")


def check_timing(timing: str) -> None:
    if timing not in TIMINGS:
        raise ValueError(f"timing {timing!r}; allowed: {', '.join(TIMINGS)}")


def timing_for(timing: str, attention: str) -> str:
    """`timing`, or "eager" (with a warning) where the attention backend cannot be captured
    into a CUDA graph: it would fail at the first capture, minutes into a GPU session."""
    from costmodel.kernels import HOST_READING_BACKENDS

    check_timing(timing)
    if timing == "graph" and attention in HOST_READING_BACKENDS:
        logger.warning("attention %r reads the sequence offsets on the host, which a CUDA "
                       "graph cannot hold: timing eagerly", attention)
        return "eager"
    return timing


@dataclass(frozen=True)
class Measurement:
    median_ms: float
    spread: float
    """(p90 − p10) / median over the repeats: the relative noise of this point."""
    repeats: int

    @classmethod
    def from_samples(cls, samples_ms: list[float] | np.ndarray) -> Measurement:
        s = np.asarray(samples_ms, dtype=np.float64)
        if s.size == 0 or not np.all(np.isfinite(s)) or np.any(s <= 0):
            raise ValueError(f"timer returned invalid samples {s.tolist()} (need finite, > 0 ms)")
        med = float(np.median(s))
        p10, p90 = np.percentile(s, [10, 90])
        return cls(median_ms=med, spread=float((p90 - p10) / med), repeats=int(s.size))


@runtime_checkable
class Timer(Protocol):
    """What the pipeline needs from a timer."""

    timing: str
    """How points are timed ("graph" or "eager"; see `TIMINGS`): the results record it."""

    def measure(self, point: SweepPoint, *, repeats: int, warmup: int) -> Measurement:
        """Time one call of the workload `point` describes (ms): median over `repeats`
        after untimed warm-up calls (`warmup` at least; `time_cuda` says how many)."""
        ...

    def device_fingerprint(self) -> dict[str, Any]:
        """Name, SM count, L2 size, versions ... of the device being timed."""
        ...


# ---- CUDA events ---------------------------------------------------------------------------
class _L2Flusher:
    def __init__(self, torch_mod, l2_bytes: int, device: int):
        self._buf = torch_mod.empty(max(2 * int(l2_bytes), 1 << 20), dtype=torch_mod.int8,
                                    device=f"cuda:{device}")

    def __call__(self) -> None:
        self._buf.zero_()


# One flush buffer per (device, L2 size): zeroing a buffer on another GPU would leave this
# one's L2 warm (and time nothing but a launch on the other GPU's stream).
_FLUSHERS: dict[tuple[int, int], _L2Flusher] = {}


class GraphCaptureError(RuntimeError):
    """A workload could not be captured into a CUDA graph (a host sync inside, say);
    ``reason``: the first line of what broke the capture."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"this workload cannot be captured into a CUDA graph ({reason}); time it "
                         "eagerly instead (--timing eager)")
        self.reason = reason


def capture_cuda_graph(fn: Callable[[], Any], *, warmup: int = 1):
    """Run `fn` `warmup` times (at least twice) on a side stream, then capture one call into
    a CUDA graph and return it (`graph.replay()` reruns the captured kernels).

    The side-stream warm-up is what PyTorch asks for before capture: autograd, cuBLAS
    workspaces and Triton compilation are set up outside the graph. Raises
    GraphCaptureError, with the fix, when `fn` does something a graph cannot hold.
    """
    import torch

    side = _side_stream(torch)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # Twice at least: the first backward creates the parameters' .grad without a
        # kernel, later ones add into it; the captured call must run nothing new.
        for _ in range(max(2, warmup)):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.current_stream()
    raised: list[BaseException] = []  # what fn itself raised inside the capture, if anything
    try:
        with torch.cuda.graph(graph):
            try:
                fn()
            except BaseException as err:
                raised.append(err)
                raise
    except RuntimeError as exc:
        # torch.cuda.graph leaves its capture stream current when capture_end raises.
        torch.cuda.set_stream(stream)
        # An error inside the capture (a host sync, say) is followed by capture_end failing
        # with "operation failed due to a previous error during capture": report fn's own.
        cause = raised[0] if raised else exc
        if isinstance(cause, torch.cuda.OutOfMemoryError) or not isinstance(cause, RuntimeError):
            # A size problem (the caller says what to lower), an interrupt, or a bug in the
            # workload: not a capture problem, so not "time it eagerly".
            raise cause from None
        # The CLI shows one line; the traceback says which operation broke the capture.
        logger.warning("CUDA graph capture failed", exc_info=cause)
        first = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        raise GraphCaptureError(first) from exc
    # A graph holds no reference to the tensors it reads: keep fn (and its closure) alive
    # for as long as the graph can be replayed (an attribute of ours, so not in torch's stubs).
    graph.keep_alive = fn  # type: ignore[attr-defined]
    graph.replay()  # the first replay uploads the graph: keep it out of the timings
    torch.cuda.synchronize()
    return graph


_SIDE_STREAMS: dict[int, Any] = {}


def _side_stream(torch):
    """One side stream per device for every warm-up (a new stream per capture could get
    its own cuBLAS workspace each time)."""
    device = torch.cuda.current_device()
    if device not in _SIDE_STREAMS:
        _SIDE_STREAMS[device] = torch.cuda.Stream()
    return _SIDE_STREAMS[device]


def time_cuda(
    fn: Callable[[], Any],
    *,
    repeats: int,
    warmup: int,
    working_set_bytes: int | None = None,
    l2_bytes: int | None = None,
    graph: bool = False,
) -> Measurement:
    """Time `fn` on the current CUDA device with CUDA events (see the module docstring)."""
    import torch

    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
    if graph:
        captured = capture_cuda_graph(fn, warmup=warmup)
        fn = captured.replay
    else:
        for _ in range(max(1, warmup)):
            fn()
        torch.cuda.synchronize()
    device = torch.cuda.current_device()
    if l2_bytes is None:
        l2_bytes = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0))
    flush = None
    if l2_bytes and working_set_bytes is not None and working_set_bytes <= l2_bytes:
        flush = _FLUSHERS.get((device, l2_bytes))
        if flush is None:
            flush = _FLUSHERS[device, l2_bytes] = _L2Flusher(torch, l2_bytes, device)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    for i in range(repeats):
        if flush is not None:
            flush()
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return Measurement.from_samples([s.elapsed_time(e) for s, e in zip(starts, ends)])


def time_cpu(fn: Callable[[], Any], *, repeats: int, warmup: int) -> Measurement:
    """Wall-clock time of `fn` on the CPU (dry runs of the GPU workloads; not a calibration)."""
    import time

    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return Measurement.from_samples(samples)


# ---- synthetic timer (CPU tests) ---------------------------------------------------------------
@dataclass(kw_only=True)
class SyntheticShape:
    """A known cost shape, built from the spec's FLOPs at plausible efficiencies.

    attention per sequence: flops(L) / (peak · e_attn(L)), e_attn = 0.5 · L / (L + 512),
    plus `attn_call_ms` per call; linear: max(floor, flops(T) / (peak · 0.6)) with a step
    in time per token: × (1 + step) for T ≥ step_at; head: floor + flops / (peak · 0.6);
    a layer adds `glue_ms` to linear + Σ attn + call. Train is 3× forward work with a
    3.5× attention factor. `speedup` > 1 makes every time impossibly fast.
    """

    peak_flops: float = 989.4e12
    attn_call_ms: float = 0.02
    linear_floor_ms: float = 0.3
    head_floor_ms: float = 0.08
    glue_ms: float = 0.01
    step_at: int = 12288
    step: float = 0.08
    speedup: float = 1.0

    def attention_ms(self, spec, lengths: np.ndarray, mode: str) -> np.ndarray:
        from costmodel import flops

        L = np.asarray(lengths, dtype=np.float64)
        eff = 0.5 * L / (L + 512.0)
        fwd = flops.attention_core_flops(np.asarray(lengths, dtype=np.int64), spec) / (self.peak_flops * eff) * 1e3
        return fwd * (3.5 if mode == "train" else 1.0)

    def linear_ms(self, spec, tokens: float, mode: str, moe: bool) -> float:
        from costmodel import flops

        passes = flops.pass_factor(mode)
        work = passes * float(flops.layer_linear_flops(tokens, spec, moe=moe)) / (self.peak_flops * 0.6) * 1e3
        if tokens >= self.step_at:
            work *= 1.0 + self.step
        return max(self.linear_floor_ms * passes, work)

    def head_ms(self, spec, tokens: float, mode: str) -> float:
        from costmodel import flops

        passes = flops.pass_factor(mode)
        work = passes * tokens * flops.lm_head_flops_per_token(spec) / (self.peak_flops * 0.6) * 1e3
        return self.head_floor_ms * passes + work

    def call_ms(self, mode: str) -> float:
        return self.attn_call_ms * (3.0 if mode == "train" else 1.0)

    def point_ms(self, spec, point: SweepPoint) -> float:
        L = np.asarray(point.lengths)
        if point.kind == "attention":
            t = self.call_ms(point.mode) + float(self.attention_ms(spec, L, point.mode).sum())
        elif point.kind == "linear":
            t = self.linear_ms(spec, point.tokens, point.mode, point.moe)
        elif point.kind == "head":
            t = self.head_ms(spec, point.tokens, point.mode)
        elif point.kind in ("layer", "stack"):
            layer = (
                self.glue_ms + self.call_ms(point.mode)
                + float(self.attention_ms(spec, L, point.mode).sum())
                + self.linear_ms(spec, point.tokens, point.mode, point.moe)
            )
            t = layer * point.num_layers
            if point.kind == "stack":
                t += self.head_ms(spec, point.tokens, point.mode)
        else:
            raise ValueError(f"unknown point kind {point.kind!r}")
        return t / self.speedup


class SyntheticTimer:
    """A `Timer` that returns `shape`'s time for each point times lognormal noise.

    `drift` multiplies every time by (1 + drift · fraction of calls made so far), to test
    the drift probe.
    """

    def __init__(self, spec, shape: SyntheticShape | None = None, *, noise: float = 0.01,
                 seed: int = 0, device_name: str = "NVIDIA H200",
                 drift: float = 0.0, expected_calls: int = 1000, timing: str = "graph"):
        check_timing(timing)
        self.timing = timing  # what it stands in for
        self.spec = spec
        self.shape = shape or SyntheticShape()
        self.noise = noise
        self.device_name = device_name
        self.drift = drift
        self.expected_calls = expected_calls
        self.calls = 0
        self._rng = np.random.default_rng(seed)

    def measure(self, point: SweepPoint, *, repeats: int = 5, warmup: int = 1) -> Measurement:
        base = self.shape.point_ms(self.spec, point)
        factor = 1.0 + self.drift * min(1.0, self.calls / max(1, self.expected_calls))
        self.calls += 1
        samples = base * factor * np.exp(self._rng.normal(0.0, self.noise, repeats))
        return Measurement.from_samples(samples)

    def device_fingerprint(self) -> dict[str, Any]:
        return {
            "name": self.device_name,
            "synthetic": True,
            "sm_count": 132,
            "compute_capability": "9.0",
            "l2_cache_bytes": 50 * 2**20,
            "driver": None,
            "torch": None,
            "triton": None,
            "cuda": None,
            "costmodel": costmodel.__version__,  # whose sweep it was, as on a GPU
        }

