"""`time_cuda` and `capture_cuda_graph` control flow, on a fake `torch.cuda` (no GPU here).

What a real GPU checks (tests marked gpu): the timings themselves. What this checks: that
graph timing warms up on a side stream, captures exactly one call, keeps the graph's first
(upload) replay out of the timings, times one replay per repeat, and turns a failed capture
into a GraphCaptureError that names the eager fallback.
"""

from __future__ import annotations

import contextlib
import sys
import types

import pytest

from costmodel.calibration import timer
from costmodel.calibration.timer import GraphCaptureError, capture_cuda_graph, time_cuda


class FakeCuda:
    """Just enough of torch.cuda for the timer: streams, events, graphs, a log of calls."""

    OutOfMemoryError = type("OutOfMemoryError", (RuntimeError,), {})

    def __init__(self, capture_fails: bool = False):
        self.log: list[str] = []
        self.stream_stack = ["default"]
        self.capturing = False
        self.capture_fails = capture_fails
        self.clock = 0.0
        cuda = self

        class Stream:
            def __init__(self):
                self.name = "side"

            def wait_stream(self, other):
                cuda.log.append(f"{self.name} waits")

        class Current:
            name = "default"

            def wait_stream(self, other):
                cuda.log.append("default waits")

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = cuda.clock

            def elapsed_time(self, other):
                return other.t - self.t

        class CUDAGraph:
            def replay(self):
                cuda.log.append("replay")
                cuda.clock += 2.0

        self.Stream, self.Event, self.CUDAGraph = Stream, Event, CUDAGraph
        self._current = Current()

    def current_stream(self):
        return self._current

    @contextlib.contextmanager
    def stream(self, s):
        self.stream_stack.append(s.name)
        try:
            yield
        finally:
            self.stream_stack.pop()

    def set_stream(self, s):
        self._current = s

    @contextlib.contextmanager
    def graph(self, g):
        self.capturing = True
        before, self._current = self._current, "capture stream"
        try:
            yield
            if self.capture_fails:
                raise RuntimeError("operation not permitted when stream is capturing\nmore")
            self._current = before  # as torch: its capture stream stays current when capture_end raises
        except BaseException:
            # As torch does: capture_end fails again after any error inside the capture,
            # and that second error carries the first as its __context__.
            if not self.capture_fails:
                raise RuntimeError("operation failed due to a previous error during capture")  # noqa: B904 (implicit __context__, as torch)
            raise
        finally:
            self.capturing = False

    def synchronize(self):
        self.log.append("sync")

    device = 0  # the current device's index

    def current_device(self):
        return self.device


@pytest.fixture
def fake_cuda(monkeypatch):
    def install(**kw):
        cuda = FakeCuda(**kw)
        fake = types.SimpleNamespace(cuda=cuda)
        monkeypatch.setitem(sys.modules, "torch", fake)
        monkeypatch.setattr(timer, "_SIDE_STREAMS", {})  # streams of an earlier fake
        return cuda

    return install


def workload(cuda: FakeCuda):
    def fn():
        where = "capture" if cuda.capturing else cuda.stream_stack[-1]
        cuda.log.append(f"call on {where}")
        cuda.clock += 5.0  # an eager call: launch overhead + kernels

    return fn


def test_graph_timing_times_replays_only(fake_cuda):
    cuda = fake_cuda()
    m = time_cuda(workload(cuda), repeats=4, warmup=2, l2_bytes=0, graph=True)
    calls = [e for e in cuda.log if e.startswith("call")]
    assert calls == ["call on side", "call on side", "call on capture"]
    assert cuda.log.count("replay") == 1 + 4  # the upload replay, then one per repeat
    assert m.median_ms == 2.0 and m.repeats == 4  # replays only: no eager call was timed


def test_l2_is_flushed_only_where_the_working_set_fits_in_it(fake_cuda, monkeypatch):
    """Data that fits in L2 would be timed warm from the second repeat: flushed before each
    one. A working set larger than L2 evicts itself: no flush (it would only add time)."""
    cuda = fake_cuda()
    zeroed = []

    class Buffer:
        def zero_(self):
            zeroed.append(1)

    torch = sys.modules["torch"]
    torch.int8, torch.empty = "int8", lambda *a, **k: Buffer()
    monkeypatch.setattr(timer, "_FLUSHERS", {})
    time_cuda(workload(cuda), repeats=3, warmup=1, l2_bytes=50 << 20, working_set_bytes=1 << 20)
    assert len(zeroed) == 3
    zeroed.clear()
    time_cuda(workload(cuda), repeats=3, warmup=1, l2_bytes=50 << 20, working_set_bytes=1 << 30)
    assert zeroed == []


def test_eager_timing_times_calls(fake_cuda):
    cuda = fake_cuda()
    m = time_cuda(workload(cuda), repeats=3, warmup=1, l2_bytes=0, graph=False)
    assert [e for e in cuda.log if e.startswith("call")] == ["call on default"] * 4
    assert "replay" not in cuda.log and m.median_ms == 5.0


def test_failed_capture_names_the_eager_fallback(fake_cuda):
    cuda = fake_cuda(capture_fails=True)
    with pytest.raises(GraphCaptureError, match=r"cannot be captured.*\(operation not permitted "
                       r"when stream is capturing\); time it eagerly instead \(--timing eager\)"):
        capture_cuda_graph(workload(cuda), warmup=1)


def test_a_failed_capture_gives_back_the_current_stream(fake_cuda):
    """torch.cuda.graph leaves its capture stream current when capture_end raises; the
    eager timing that follows a failed capture must run on the stream it ran on before."""
    cuda = fake_cuda(capture_fails=True)
    before = cuda.current_stream()
    with pytest.raises(GraphCaptureError):
        capture_cuda_graph(workload(cuda), warmup=1)
    assert cuda.current_stream() is before


def test_a_sync_inside_the_capture_is_reported_not_the_follow_up_error(fake_cuda):
    cuda = fake_cuda()

    def syncs():
        if cuda.capturing:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    with pytest.raises(GraphCaptureError, match=r"\(CUDA error: operation not permitted when "
                       r"stream is capturing\)"):
        capture_cuda_graph(syncs, warmup=1)


def test_a_failed_capture_logs_the_traceback_of_its_cause(fake_cuda, caplog):
    cuda = fake_cuda()

    def syncs():
        if cuda.capturing:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    with pytest.raises(GraphCaptureError):
        capture_cuda_graph(syncs, warmup=1)
    (record,) = [r for r in caplog.records if r.name == "costmodel.calibration.timer"]
    assert record.levelname == "WARNING" and "syncs" in caplog.text  # the frame that broke it
    assert "operation not permitted" in str(record.exc_info[1])


def test_an_error_the_workload_handled_is_not_taken_for_the_cause(fake_cuda):
    """A capture broken inside an except block (a fast path tried, then a fallback): the
    error fn raised is the cause, not the one it had handled (its __context__)."""
    cuda = fake_cuda()

    def falls_back():
        if cuda.capturing:
            try:
                {}["fast path"]
            except KeyError:
                raise RuntimeError("operation not permitted when stream is capturing") from None

    with pytest.raises(GraphCaptureError, match=r"\(operation not permitted when stream"):
        capture_cuda_graph(falls_back, warmup=1)


@pytest.mark.parametrize("error", [ValueError("bad shape"), KeyboardInterrupt()])
def test_errors_that_are_not_capture_problems_pass_through(fake_cuda, error):
    cuda = fake_cuda()

    def breaks():
        if cuda.capturing:
            raise error

    # Not "time it eagerly": a bug in the workload, or Ctrl-C / a step's timeout.
    with pytest.raises(type(error)) as info:
        capture_cuda_graph(breaks, warmup=1)
    assert info.value is error


def test_the_captured_call_follows_two_warm_up_calls_at_least(fake_cuda):
    cuda = fake_cuda()
    capture_cuda_graph(workload(cuda), warmup=1)
    # The first backward creates .grad without a kernel; the second adds into it as every
    # replay will, so the capture meets no operation the warm-up did not run.
    assert [e for e in cuda.log if e.startswith("call")] == ["call on side"] * 2 + ["call on capture"]


def test_out_of_memory_in_the_capture_stays_out_of_memory(fake_cuda):
    cuda = fake_cuda()

    def too_big():
        if cuda.capturing:
            raise cuda.OutOfMemoryError("CUDA out of memory")

    with pytest.raises(cuda.OutOfMemoryError):
        capture_cuda_graph(too_big, warmup=1)


def test_the_graph_keeps_its_workload_alive(fake_cuda):
    cuda = fake_cuda()
    fn = workload(cuda)
    graph = capture_cuda_graph(fn, warmup=1)
    assert graph.keep_alive is fn  # the tensors its closure holds outlive the capture


def test_every_capture_warms_up_on_one_side_stream(fake_cuda):
    """A new stream per capture could get its own cuBLAS workspace each time: one per device."""
    cuda = fake_cuda()
    made = []
    Stream = cuda.Stream
    cuda.Stream = lambda: made.append(Stream()) or made[-1]
    capture_cuda_graph(workload(cuda), warmup=1)
    capture_cuda_graph(workload(cuda), warmup=1)
    assert len(made) == 1 and cuda.log.count("side waits") == 2  # one side stream, reused


def test_a_measurement_is_the_median_and_the_relative_spread_of_its_repeats():
    """One slow repeat (a clock dip, a neighbour's kernel) moves a mean, not the median;
    the spread is the 10-90% range over the median."""
    m = timer.Measurement.from_samples([1.0, 1.0, 1.0, 1.0, 100.0])
    assert m.median_ms == 1.0 and m.repeats == 5
    s = timer.Measurement.from_samples([2.0 * i for i in range(1, 12)])  # p10 4, p90 20, median 12
    assert s.spread == pytest.approx(16 / 12)


@pytest.mark.parametrize("samples", [[], [1.0, 0.0, 1.0], [1.0, float("nan")], [-1.0, 1.0], [1.0, float("inf")]])
def test_a_measurement_refuses_samples_no_timer_can_return(samples):
    """No repeats, a zero, negative or non-finite time: a broken timer, not a measurement."""
    with pytest.raises(ValueError, match="timer returned invalid samples"):
        timer.Measurement.from_samples(samples)


def _flush_buffers(cuda, monkeypatch, flush_ms: float = 0.0):
    """Give the fake torch an int8 `empty` whose `zero_` takes `flush_ms` of device time;
    returns the sizes of the buffers made and a list with one entry per flush."""
    sizes, zeroed = [], []

    class Buffer:
        def zero_(self):
            zeroed.append(1)
            cuda.clock += flush_ms

    def empty(size, **kw):
        sizes.append((size, kw["device"]))
        return Buffer()

    torch = sys.modules["torch"]
    torch.int8, torch.empty = "int8", empty
    monkeypatch.setattr(timer, "_FLUSHERS", {})
    return sizes, zeroed


def test_the_l2_flush_buffer_is_twice_the_l2_and_one_per_size_and_device(fake_cuda, monkeypatch):
    """Zeroing twice the L2 evicts all of it (a buffer the L2's size may partly hit itself);
    at least 1 MiB; made once per L2 size and GPU, not per measurement, on the GPU timed."""
    cuda = fake_cuda()
    sizes, zeroed = _flush_buffers(cuda, monkeypatch)
    time_cuda(workload(cuda), repeats=2, warmup=1, l2_bytes=50 << 20, working_set_bytes=1 << 20)
    time_cuda(workload(cuda), repeats=2, warmup=1, l2_bytes=50 << 20, working_set_bytes=1 << 20)
    time_cuda(workload(cuda), repeats=2, warmup=1, l2_bytes=1000, working_set_bytes=1000)
    cuda.device = 1
    time_cuda(workload(cuda), repeats=2, warmup=1, l2_bytes=50 << 20, working_set_bytes=1 << 20)
    assert sizes == [(100 << 20, "cuda:0"), (1 << 20, "cuda:0"), (100 << 20, "cuda:1")]
    assert len(zeroed) == 8


def test_a_working_set_the_size_of_the_l2_is_flushed_and_an_unknown_one_is_not(fake_cuda, monkeypatch):
    """"Fits in L2" includes filling it exactly; with no working set given the timer cannot
    tell, and times without flushing (no error)."""
    cuda = fake_cuda()
    _, zeroed = _flush_buffers(cuda, monkeypatch)
    time_cuda(workload(cuda), repeats=3, warmup=1, l2_bytes=50 << 20, working_set_bytes=50 << 20)
    assert len(zeroed) == 3
    zeroed.clear()
    time_cuda(workload(cuda), repeats=3, warmup=1, l2_bytes=50 << 20)
    assert zeroed == []


@pytest.mark.parametrize("graph", [False, True])
def test_the_l2_flush_stays_outside_the_timed_events(fake_cuda, monkeypatch, graph):
    cuda = fake_cuda()
    _flush_buffers(cuda, monkeypatch, flush_ms=100.0)
    m = time_cuda(workload(cuda), repeats=3, warmup=1, l2_bytes=50 << 20, working_set_bytes=1 << 20,
                  graph=graph)
    assert m.median_ms == (2.0 if graph else 5.0)


def test_eager_timing_warms_up_once_even_when_asked_for_none(fake_cuda):
    """The first call pays for autotuning, compilation and allocator growth: never timed."""
    cuda = fake_cuda()
    calls = 0

    def fn():
        nonlocal calls
        calls += 1
        cuda.clock += 50.0 if calls == 1 else 5.0

    m = time_cuda(fn, repeats=3, warmup=0, l2_bytes=0)
    assert calls == 4 and m.median_ms == 5.0 and m.spread == 0.0


@pytest.mark.parametrize("repeats, warmup", [(0, 1), (3, -1)])
def test_timers_refuse_no_repeats_or_negative_warm_up(fake_cuda, repeats, warmup):
    cuda = fake_cuda()
    for time_fn in (time_cuda, timer.time_cpu):
        with pytest.raises(ValueError, match="need repeats >= 1 and warmup >= 0"):
            time_fn(workload(cuda), repeats=repeats, warmup=warmup)
    assert not [e for e in cuda.log if e.startswith("call")]  # refused before any call


def test_cpu_timing_is_milliseconds_of_the_timed_calls_only(monkeypatch):
    """`time_cpu`: `warmup` untimed calls, then one wall-clock sample per repeat, in ms."""
    import time

    clock = [0.0]
    calls = []

    def fn():
        calls.append(1)
        clock[0] += 1.0 if len(calls) <= 2 else 0.004  # two slow first calls, then 4 ms

    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    m = timer.time_cpu(fn, repeats=3, warmup=2)
    assert len(calls) == 5 and m.median_ms == pytest.approx(4.0) and m.repeats == 3
