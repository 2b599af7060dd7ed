"""`costmodel bench-schedule` end to end on CPU, with an injected micro-batch measurer."""

from __future__ import annotations

import functools
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest

from costmodel.cli import build_parser, main
from costmodel.commands import bench_schedule
from costmodel.estimate import estimate_cost_model
from costmodel.spec import ModelSpec
from costmodel.training import bench
from costmodel.training import microbatch_timer as timer_mod

SPEC = ModelSpec.from_preset("qwen3-8b")
TRUTH = estimate_cost_model(SPEC, "h200")


def fake_measure(lengths) -> float:
    """A stand-in GPU: the registry estimate of one layer, 3% slower than predicted."""
    return 1.03 * TRUTH.stack_cost(list(lengths), num_layers=1, head=False)


@functools.cache
def _truth_file() -> str:
    """TRUTH as a cost model file (the shipped h200/qwen3-8b is a measured profile, not
    the shape the fake measurer follows)."""
    path = Path(tempfile.mkdtemp(prefix="costmodel-truth-")) / "truth.json"
    TRUTH.save(path)
    return str(path)


def _with_truth(argv: list[str]) -> list[str]:
    return [_truth_file() if a == "TRUTH" else a for a in argv]


def _run(argv: list[str], measure=fake_measure) -> int:
    args = build_parser().parse_args(["bench-schedule", *_with_truth(argv)])
    return bench_schedule.run(args, measure=measure)


ALL = ",".join(bench.POLICIES)
SMALL = ["--samples-per-rank", "8", "--dp", "4,8", "--cost-model", "TRUTH", "--repeats", "1"]


def test_whole_command_with_a_fake_measurer(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert _run([*SMALL, "--policies", ALL, "-o", str(out), "--per-rank"]) == 0
    text = capsys.readouterr().out
    assert "speed-up" in text and "calibrated" in text and "baseline" in text
    assert "dp 8 calibrated: rank predicted ms / measured ms" in text and "(-2.9%)" in text
    doc = json.loads(out.read_text())
    assert doc["schema"] == "costmodel-bench-schedule/1"
    assert doc["provenance"]["date"] and doc["provenance"]["command"].startswith("costmodel")
    assert doc["cost_model"]["is_estimate"] is True
    assert doc["device"]["measurer"].endswith("(injected)")
    runs = {(r["dp_size"], r["policy"]): r for r in doc["runs"]}
    assert set(runs) == {(dp, p) for dp in (4, 8) for p in bench.POLICIES}
    for (dp, _policy), r in runs.items():
        assert len(r["measured_rank_ms"]) == dp
        assert r["measured_makespan_ms"] == pytest.approx(max(r["measured_rank_ms"]))
        assert r["measured_max_over_mean"] >= 1.0
        # The fake GPU is the cost model x 1.03: every per-rank prediction is 3% low.
        assert np.allclose(r["rank_error_pct"], 100 * (1 / 1.03 - 1))
        lengths = [n for rank in r["microbatch_lengths"] for mb in rank for n in mb]
        assert len(lengths) == doc["batches"][str(dp)]["samples"]
    for dp in (4, 8):
        assert runs[(dp, "tokens")]["speedup_over_tokens"] == pytest.approx(1.0)
        # Balancing the measurer's own shape beats balancing tokens.
        assert (
            runs[(dp, "calibrated")]["measured_makespan_ms"]
            <= runs[(dp, "tokens")]["measured_makespan_ms"] * 1.0001
        )
    assert {t["dp_size"] for t in doc["targets"]} == {4, 8}
    for t in doc["targets"]:  # token balance's own imbalance: what balance alone can cut
        tokens = runs[(t["dp_size"], "tokens")]["measured_max_over_mean"]
        assert t["tokens_balance_headroom"] == pytest.approx(1 - 1 / tokens)
    assert "(a perfect balance of tokens' work: " in text


def test_each_distinct_microbatch_is_measured_once_per_round():
    calls: list[tuple[int, ...]] = []

    def counting(lengths):
        calls.append(tuple(lengths))
        return float(sum(lengths))

    keys = [(1, 2), (2, 1), (5,), (5,), (3, 3)]
    times, stopped, noise = timer_mod.measure_microbatches(
        [timer_mod.microbatch_key(k) for k in keys], counting, repeats=3, warmup=0
    )
    assert len(calls) == 3 * 3 and times[(1, 2)] == 3.0 and times[(5,)] == 5.0
    assert stopped is None and noise == 0.0  # the same time every round


def test_rounds_in_other_orders_cancel_clock_drift():
    """A GPU slowing down linearly over the run: every key's median of the forward and the
    reversed round is the same, so no rank looks slower for having been measured later."""
    calls = []

    def drifting(lengths):
        calls.append(tuple(lengths))
        return 10.0 * (1 + 0.001 * len(calls))

    keys = [(i,) for i in range(1, 51)]
    times, _, _ = timer_mod.measure_microbatches(keys, drifting, repeats=2, warmup=0)
    assert max(times.values()) == pytest.approx(min(times.values()))
    assert calls[:50] == keys and calls[50:] == keys[::-1]
    third = timer_mod.round_order(keys, 2)
    assert sorted(third) == keys and third != keys and third == timer_mod.round_order(keys, 2)
    assert timer_mod.measure_microbatches([], drifting) == ({}, None, None)


def test_timing_noise_and_the_noise_floor():
    rng = np.random.default_rng(1)
    sigma = 0.02  # per sample; the reported time is the median (= mean) of 2
    samples = {(i,): (100.0 * (1 + sigma * rng.standard_normal(2))).tolist() for i in range(4000)}
    noise = timer_mod.timing_noise(samples)
    assert noise == pytest.approx(sigma / np.sqrt(2), rel=0.1)
    for r in (3, 5):  # the sd of the reported median of r rounds, as simulated
        samples = {(i,): (100.0 * (1 + sigma * rng.standard_normal(r))).tolist()
                   for i in range(4000)}
        medians = np.array([np.median(v) for v in samples.values()]) / 100.0
        assert timer_mod.timing_noise(samples) == pytest.approx(medians.std(), rel=0.1)
    assert timer_mod.timing_noise({(1,): [5.0]}) is None
    # 64 ranks of 4 equal micro-batches, 1% noise each: rank noise 0.5%, E[max of 64] ~ 2.4 sd
    floor = timer_mod.noise_floor([[10.0] * 4] * 64, 0.01)
    assert 1.009 < floor < 1.016
    assert timer_mod.noise_floor([[10.0] * 4] * 64, 0.0) == pytest.approx(1.0)


class FakeTimer:
    """Also times whole ranks, like `LayerTimer.measure_rank` (back to back: 1% faster)."""

    def __init__(self):
        self.ranks = 0

    def __call__(self, lengths):
        return fake_measure(lengths)

    def measure_rank(self, microbatches):
        self.ranks += 1
        return 0.99 * sum(fake_measure(mb) for mb in microbatches)


def test_slowest_rank_is_also_timed_end_to_end(tmp_path, capsys):
    timer = FakeTimer()
    out = tmp_path / "b.json"
    assert _run([*SMALL, "--policies", "tokens,calibrated", "-o", str(out)], measure=timer) == 0
    assert timer.ranks == 2 * 2  # (dp 4, dp 8) x 2 policies, 1 round
    assert "end to end / sum of its micro-batches: 0.990" in capsys.readouterr().out
    for r in json.loads(out.read_text())["runs"]:
        assert r["slowest_rank_direct_ms"] == pytest.approx(0.99 * r["measured_makespan_ms"])


def test_lengths_file_and_fixed_batch(tmp_path, capsys):
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(str(n) for n in np.random.default_rng(1).integers(100, 9000, 40)))
    out = tmp_path / "b.json"
    assert _run(["--lengths", str(lengths), "--dp", "2,4", "--policies", "tokens,flops",
                 "--repeats", "1", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["batches"]["2"]["samples"] == doc["batches"]["4"]["samples"] == 40


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--policies", "tokens,magic"], "magic"),
        (["--dp", "8,x"], "--dp"),
        (["--cap", "0"], "--cap"),
        (["--samples", "4", "--dp", "8", "--policies", "tokens"], "larger than the 4 samples"),
        (["--lengths", "no-such-file.txt"], "neither a built-in distribution"),
    ],
)
def test_bad_input_is_one_line(argv, needle, capsys, monkeypatch):
    # `main` has no measurer to inject: route the CLI's `run` through the fake one.
    real = bench_schedule.run
    monkeypatch.setattr(bench_schedule, "run", lambda args: real(args, measure=fake_measure))
    assert main(["bench-schedule", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err, err


def test_junk_lengths_file(tmp_path, capsys):
    junk = tmp_path / "lengths.txt"
    junk.write_text("100\n200\nlots\n")
    args = build_parser().parse_args(["bench-schedule", "--lengths", str(junk), "--dp", "2"])
    with pytest.raises(ValueError, match="line 3"):
        bench_schedule.run(args, measure=fake_measure)


def test_other_shape_cost_model_is_refused(tmp_path):
    other = tmp_path / "cm.json"
    estimate_cost_model(ModelSpec.from_preset("qwen3-0.6b"), "h200").save(other)
    with pytest.raises(ValueError, match="shape"):
        _run([*SMALL, "--cost-model", str(other)])


def test_a_graph_timed_cost_model_against_eager_measurements_is_noted(tmp_path, capsys):
    """A profile calibrated from CUDA-graph replays (no launch overhead) judged by eager
    micro-batch times: the per-rank error includes that difference; say so and record it."""
    doc = json.loads(Path(_truth_file()).read_text())
    doc["kernels"] = {"timing": "graph"}
    graph_timed = tmp_path / "graph.json"
    graph_timed.write_text(json.dumps(doc))

    class EagerGPU:
        timing = "eager"

        def __call__(self, lengths):
            return fake_measure(lengths)

    out = tmp_path / "bench.json"
    argv = [*SMALL, "--cost-model", str(graph_timed), "--policies", "tokens,calibrated"]
    assert _run([*argv, "-o", str(out)], measure=EagerGPU()) == 0
    assert "calibrated with graph timing and this benchmark times eager" in capsys.readouterr().err
    written = json.loads(out.read_text())
    assert written["cost_model"]["timing"] == "graph" and written["device"]["timing"] == "eager"
    assert _run(argv, measure=fake_measure) == 0  # a measurer that does not say: no note
    assert "timing" not in capsys.readouterr().err


def test_needs_a_gpu_without_a_fake_measurer(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the real timer would run")
    assert main(["bench-schedule", "--dp", "2", "--samples-per-rank", "2", "--policies", "tokens"]) == 2
    err = capsys.readouterr().err
    assert "GPU" in err and len(err.strip().splitlines()) == 1


def _tiny_cpu_timer():
    """A tiny layer's spec and the GPU timer's code path on it, on CPU (wall clock)."""
    pytest.importorskip("torch")
    tiny = ModelSpec(name="tiny", num_layers=2, hidden_size=32, num_heads=2, num_kv_heads=1,
                     head_dim=16, intermediate_size=64, vocab_size=64, dtype="fp32")
    return tiny, timer_mod.LayerTimer(tiny, attention="sdpa", dtype="fp32", device="cpu")


def test_real_layer_timer_path_on_cpu(tmp_path):
    """The GPU timer's code path (packed inputs, one real layer, fwd+bwd) on a tiny shape."""
    tiny, timer = _tiny_cpu_timer()
    built = []
    step = timer._step
    timer._step = lambda lengths: built.append(list(lengths)) or step(lengths)
    assert timer([40, 7]) > 0 and timer.measure_rank([[40, 7], [12]]) > 0
    # The first call also builds Triton's integer-class variants (token counts divisible by
    # 16, not, and 1), untimed; later calls do not.
    assert built == [[40, 7], [64], [65], [1], [40, 7], [12]]
    planned = bench.plan_benchmark(
        np.array([40, 7, 90, 12, 33, 64, 5, 20]), spec=tiny, cap=128, dp_sizes=[2],
        policies=["tokens", "flops"],
    )
    runs = bench.measure_benchmark(planned, measure=timer, spec=tiny, repeats=1, warmup=0)
    assert [r.policy for r in runs] == ["tokens", "flops"]
    assert all(r.slowest_rank_direct_ms > 0 and len(r.measured_ms) == 2 for r in runs)


def test_eager_timer_runs_a_larger_microbatch_once_untimed_first():
    """Eagerly, a micro-batch larger than every one before grows the caching allocator:
    the timer runs it once untimed first (a GPU test timed [4096]*4 cold after [256]*2)."""
    _, timer = _tiny_cpu_timer()
    ran = []
    build = timer._step

    def counting(lengths):
        step = build(lengths)
        return lambda: ran.append(sum(lengths)) or step()

    timer._step = counting
    timer([8, 8])
    assert ran == [16, 64, 65, 1, 16]  # warm-up (with the integer classes), then timed
    ran.clear()
    timer([32, 32])
    assert ran == [64, 64]  # larger than any before: once untimed, then timed
    ran.clear()
    timer([20])
    timer.measure_rank([[8, 8], [30, 30]])
    assert ran == [20, 16, 60]  # no larger than 64 tokens: timed only


@pytest.mark.gpu
def test_layer_timer_on_the_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    for timing in ("graph", "eager"):  # eager: the first call must not pay CUDA's start-up
        timer = timer_mod.LayerTimer(ModelSpec.from_preset("qwen3-0.6b"), timing=timing)
        small, large = timer([256] * 2), timer([4096] * 4)
        assert 0 < small < large, (timing, small, large)
        rank = timer.measure_rank([[256] * 2, [4096] * 4])
        assert 0.8 < rank / (small + large) < 1.2, (timing, rank, small, large)


class Clock:
    """A fake clock for `bench` and the command: every micro-batch measured takes 1 s."""

    def __init__(self, interrupt_at: int | None = None):
        self.t = 0.0
        self.interrupt_at = interrupt_at

    def perf_counter(self) -> float:
        return self.t

    def measure(self, lengths) -> float:
        if self.interrupt_at is not None and self.t >= self.interrupt_at:
            raise KeyboardInterrupt  # what `timeout --signal=INT` delivers
        self.t += 1
        return fake_measure(lengths)


LIMITED = [*SMALL, "--policies", "tokens,calibrated", "--warmup", "0"]


@pytest.fixture
def clock(monkeypatch):
    """The clock, and how many micro-batches (= seconds) a whole run measures."""
    clock = Clock()
    monkeypatch.setattr(bench, "time", clock)
    monkeypatch.setattr(timer_mod, "time", clock)
    monkeypatch.setattr(bench_schedule, "time", clock)
    assert _run(LIMITED, measure=clock.measure) == 0
    total, clock.t = clock.t, 0.0
    return clock, total


@pytest.mark.parametrize("stop", ["time-limit", "sigint"])
def test_stopping_early_writes_the_schedules_measured_in_full(stop, clock, tmp_path, capsys):
    """dp 4 is ~1/3 of the micro-batches: stopped at 40%, dp 4 is reported, dp 8 is not."""
    clock, total = clock
    out = tmp_path / "b.json"
    argv = [*LIMITED, "-o", str(out)]
    if stop == "time-limit":
        argv += ["--time-limit-s", str(0.4 * total)]
    else:
        clock.interrupt_at = int(0.4 * total)
    capsys.readouterr()
    assert _run(argv, measure=clock.measure) == 0
    doc = json.loads(out.read_text())
    assert [(r["dp_size"], r["policy"]) for r in doc["runs"]] == [(4, "tokens"), (4, "calibrated")]
    assert doc["unmeasured"] == [[8, "tokens"], [8, "calibrated"]]
    assert doc["runs"][1]["speedup_over_tokens"] > 0
    assert clock.t <= 0.4 * total + 1
    captured = capsys.readouterr()
    assert "not measured: dp 8 tokens, dp 8 calibrated" in captured.err
    assert "calibrated" in captured.out  # the table of what was measured


def test_an_error_while_measuring_writes_what_was_measured_and_fails(clock, tmp_path, capsys):
    """A CUDA error or out-of-memory part way used to throw away everything measured: the
    GPU session gets one try. It is reported, written, and the command exits non-zero."""
    clock, total = clock

    def failing(lengths):
        if clock.t >= int(0.4 * total):
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return clock.measure(lengths)

    out = tmp_path / "b.json"
    capsys.readouterr()
    assert _run([*LIMITED, "-o", str(out)], measure=failing) == 2
    doc = json.loads(out.read_text())
    assert [(r["dp_size"], r["policy"]) for r in doc["runs"]] == [(4, "tokens"), (4, "calibrated")]
    assert doc["error"].startswith("measuring stopped on an error: RuntimeError: CUDA out of memory")
    assert "CUDA out of memory" in capsys.readouterr().err
    clock.t = 0.0
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):  # nothing measured: an error
        _run([*LIMITED, "-o", str(tmp_path / "none.json")], measure=lambda lengths: 1 / 0)
    assert not (tmp_path / "none.json").exists()


def test_an_error_timing_a_whole_rank_keeps_the_per_micro_batch_results(tmp_path, capsys):
    """A whole rank in one span (or one CUDA graph) is the likeliest to run out of memory:
    the micro-batches measured before it are written, with the error."""
    class Measurer:
        def __call__(self, lengths):
            return fake_measure(lengths)

        def measure_rank(self, microbatches):
            raise RuntimeError("CUDA out of memory (a whole rank)")

    out = tmp_path / "b.json"
    assert _run([*LIMITED, "-o", str(out)], measure=Measurer()) == 2
    doc = json.loads(out.read_text())
    assert len(doc["runs"]) == 4 and "out of memory (a whole rank)" in doc["error"]
    assert all(r["slowest_rank_direct_ms"] is None for r in doc["runs"])
    assert "out of memory" in capsys.readouterr().err


def test_a_time_limit_too_short_for_any_schedule(clock, capsys, monkeypatch):
    clock, _ = clock
    real = bench_schedule.run
    monkeypatch.setattr(bench_schedule, "run", lambda args: real(args, measure=clock.measure))
    assert main(["bench-schedule", *_with_truth(LIMITED), "--time-limit-s", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "raise --time-limit-s" in err[-1]
    assert main(["bench-schedule", *_with_truth(LIMITED), "--time-limit-s", "0"]) == 2
    assert "--time-limit-s must be > 0" in capsys.readouterr().err


def test_policies_balance_one_layer_as_measured():
    """The calibrated policy's cost is what is timed (one layer, no head, no per-micro-batch
    overhead), in the separable form; the FLOPs policy's is one layer's FLOPs."""
    from costmodel.flops import attention_core_flops, layer_linear_flops
    from costmodel.model import load_cost_model
    from costmodel.scheduler.costs import ModelCost

    model = load_cost_model("h200/qwen3-8b")
    one = bench.OneLayerCost(model, moe=False)
    assert ModelCost(one).separable
    rng = np.random.default_rng(0)
    for _ in range(5):
        mb = rng.integers(1, 6000, size=int(rng.integers(1, 6))).tolist()
        assert one.microbatch_cost(mb) == pytest.approx(
            model.stack_cost(mb, num_layers=1, head=False), rel=1e-12)
    flops = bench.one_layer_flops_cost(model.spec, moe=False)
    L = np.array([100, 4000])
    expected = 3 * (layer_linear_flops(L, model.spec, moe=False) + attention_core_flops(L, model.spec))
    assert flops.microbatch_cost(L) == pytest.approx(float(expected.sum()))


def test_a_cost_model_without_train_curves_is_refused_before_the_gpu(tmp_path, capsys):
    """It failed deep in the scheduler with KeyError 'train' (an outside review)."""
    doc = json.loads(Path(_with_truth(["TRUTH"])[0]).read_text())
    del doc["curves"]["train"]
    forward_only = tmp_path / "forward.json"
    forward_only.write_text(json.dumps(doc))
    assert main(["bench-schedule", "--samples-per-rank", "8", "--dp", "4",
                 "--cost-model", str(forward_only)]) == 2
    err = capsys.readouterr().err
    assert "has curves for forward only" in err and "--modes train" in err


def test_policies_are_interleaved_within_each_dp_size():
    """Clock drift over a DP size's block must not favour the policy measured first: the
    first round alternates the policies' micro-batches, DP size by DP size."""
    def run(policy, dp, base):  # dp ranks of two micro-batches, lengths unique to the run
        mbs = [[[base + 10 * r], [base + 10 * r + 1]] for r in range(dp)]
        return bench.PlannedRun(policy, dp, None, mbs)

    planned = [run("tokens", 2, 1000), run("flops", 2, 2000), run("tokens", 4, 3000),
               run("flops", 4, 4000)]
    order = [k[0] for k in bench._measuring_order(planned)]
    assert order == [1000, 2000, 1001, 2001, 1010, 2010, 1011, 2011,
                     3000, 4000, 3001, 4001, 3010, 4010, 3011, 4011,
                     3020, 4020, 3021, 4021, 3030, 4030, 3031, 4031]


# -- from a mutation check: each test fails when the code it names is broken ---------------


def test_bench_schedule_cap_equal_to_the_longest_sample_is_allowed(tmp_path, capsys):
    """--cap 400 with a longest sample of 400 tokens is a valid benchmark."""
    from costmodel.commands import bench_schedule

    f = tmp_path / "l.txt"
    f.write_text("100\n200\n300\n400\n")
    args = build_parser().parse_args(["bench-schedule", "--lengths", str(f), "--dp", "2",
                                      "--policies", "tokens", "--cap", "400", "--repeats", "1"])
    assert bench_schedule.run(args, measure=lambda lengths: float(sum(lengths))) == 0


def test_each_policy_balances_its_own_cost():
    """The flops policy balances one layer's FLOPs, not tokens under another name: on a
    long-tailed batch it builds other schedules, better balanced in FLOPs."""
    from costmodel.scheduler import generate_lengths

    spec = ModelSpec.from_preset("qwen3-8b")
    lengths = generate_lengths(128, seed=2)
    planned = {r.policy: r for r in bench.plan_benchmark(lengths, spec=spec, cap=16384, dp_sizes=[8],
                                                          policies=["tokens", "flops"])}
    flops = bench.one_layer_flops_cost(spec, moe=False)

    def flops_max_over_mean(run):
        per_rank = [sum(flops.sample_costs(np.array(mb, dtype=np.int64)).sum() for mb in rank)
                    for rank in run.microbatch_lengths]
        return max(per_rank) / np.mean(per_rank)

    assert planned["flops"].microbatch_lengths != planned["tokens"].microbatch_lengths
    assert flops_max_over_mean(planned["flops"]) < flops_max_over_mean(planned["tokens"])
