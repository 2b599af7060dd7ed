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
        (["--align", "0"], "--align must be an integer >= 1, got 0"),
        (["--mode", "fwd", "--policies", "tokens"], "--mode 'fwd': did you mean 'forward'?"),
        (["--samples", "8", "--dp", "4", "--align", "3", "--policies", "tokens"],
         "DP size 4 x align 3 (micro-batches per rank) is larger than the 8 samples"),
        (["--samples-per-rank", "2", "--dp", "4", "--align", "3", "--policies", "tokens"],
         "smaller --dp or --align"),
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


def _graph_timed_profile(tmp_path) -> Path:
    """The test's cost model, marked as calibrated from CUDA-graph replays."""
    doc = json.loads(Path(_truth_file()).read_text())
    doc["kernels"] = {"timing": "graph"}
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(doc))
    return path


def _timed_gpu(timing: str) -> type:
    """A fake measurer class that says it times micro-batches as ``timing``."""

    class FakeGPU:
        def __call__(self, lengths):
            return fake_measure(lengths)

    FakeGPU.timing = timing
    return FakeGPU


def test_a_graph_timed_cost_model_against_eager_measurements_is_noted(tmp_path, capsys):
    """A profile calibrated from CUDA-graph replays (no launch overhead) judged by eager
    micro-batch times: the per-rank error includes that difference; say so and record it."""
    graph_timed = _graph_timed_profile(tmp_path)
    eager_gpu = _timed_gpu("eager")()
    out = tmp_path / "bench.json"
    argv = [*SMALL, "--cost-model", str(graph_timed), "--policies", "tokens,calibrated"]
    assert _run([*argv, "-o", str(out)], measure=eager_gpu) == 0
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
    assert "pick --mode forward" in err


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


# -- from a second mutation check (issue 6): each test fails when the code it names is broken --


def test_a_schedule_is_checked_for_every_sample_once_and_the_cap():
    """A sample longer than the cap may run alone; a duplicated or missing sample, or a
    micro-batch of several samples over the cap, is an error naming the policy."""
    lengths = np.array([500, 40, 60, 30])
    bench.check_schedule([[[0], [1, 2]], [[3]]], 4, 100, lengths, "p")
    with pytest.raises(RuntimeError, match="policy p: a sample is missing or scheduled twice"):
        bench.check_schedule([[[0], [1, 2]], [[3], [2]]], 4, 100, lengths, "p")
    with pytest.raises(RuntimeError, match="policy p: a sample is missing or scheduled twice"):
        bench.check_schedule([[[0], [1, 2]], []], 4, 100, lengths, "p")
    with pytest.raises(RuntimeError, match="policy p: a micro-batch of 130 tokens exceeds the cap 100"):
        bench.check_schedule([[[0]], [[1, 2, 3]]], 4, 100, lengths, "p")


def test_plan_refuses_a_cap_under_one_token_and_takes_one_sample_per_rank():
    """plan_benchmark is the API's check before the GPU: a cap of 0 says so; as many ranks
    as samples is the smallest valid batch, one more is refused."""
    lengths = np.array([100, 200, 300, 400])
    with pytest.raises(ValueError, match="the token cap must be at least 1, got 0"):
        bench.plan_benchmark(lengths, spec=SPEC, cap=0, dp_sizes=[2], policies=["tokens"])
    (run,) = bench.plan_benchmark(lengths, spec=SPEC, cap=1000, dp_sizes=[4], policies=["tokens"])
    assert sorted(len(rank) for rank in run.schedule) == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="DP size 5 is larger than the 4 samples"):
        bench.plan_benchmark(lengths, spec=SPEC, cap=1000, dp_sizes=[5], policies=["tokens"])


def test_policies_with_more_micro_batches_are_measured_in_full():
    """Interleaving stops for no policy: one with more micro-batches than the others has
    the rest measured after them (each policy's micro-batches in its own order)."""
    def run(policy, mbs):
        return bench.PlannedRun(policy, 1, None, [[[n] for n in mbs]])

    planned = [run("tokens", [10, 11, 12]), run("flops", [20]), run("baseline", [30, 31])]
    assert [k[0] for k in bench._measuring_order(planned)] == [10, 20, 30, 11, 31, 12]


def test_a_runs_record_has_the_speed_up_and_the_per_rank_error():
    """speed-up = token balance's makespan / this one's; rank errors are predicted / measured
    - 1 per rank, their MAPE the mean of the absolute values; max/mean by each source."""
    run = bench.PolicyRun(policy="flops", dp_size=2, schedule=[[[0]], [[1]]],
                          microbatch_lengths=[[[5]], [[7]]], measured_ms=[10.0, 8.0],
                          predicted_ms=[11.0, 6.0], predicted_own=[3.0, 1.0])
    d = run.to_dict(12.0)
    assert d["speedup_over_tokens"] == pytest.approx(1.2)
    assert d["measured_makespan_ms"] == 10.0 and d["measured_max_over_mean"] == pytest.approx(10 / 9)
    assert d["rank_error_pct"] == pytest.approx([10.0, -25.0])
    assert d["rank_mape_pct"] == pytest.approx(17.5)
    assert d["predicted_makespan_ms"] == 11.0
    assert d["predicted_max_over_mean"] == pytest.approx(11 / 8.5)
    assert d["own_cost_max_over_mean"] == pytest.approx(1.5)
    assert run.to_dict(None)["speedup_over_tokens"] is None


def test_whole_ranks_are_timed_over_every_round_and_not_after_a_stop(clock):
    """The slowest rank's end-to-end time is the median of one timing per round; once
    measuring stopped (time limit, Ctrl-C), no rank is timed end to end any more."""
    clock, total = clock
    calls = []

    class Timer:
        def __call__(self, lengths):
            return clock.measure(lengths)

        def measure_rank(self, microbatches):
            calls.append(len(calls))
            return 100.0 + len(calls)  # 101, 102, ...: the median of 2 is x.5

    planned = bench.plan_benchmark(np.array([100, 2000, 300, 4000, 500, 600]), spec=SPEC,
                                   cap=16384, dp_sizes=[2], policies=["tokens"])
    (r,) = bench.measure_benchmark(planned, measure=Timer(), spec=SPEC, repeats=2, warmup=0)
    assert len(calls) == 2 and r.slowest_rank_direct_ms == pytest.approx(101.5)
    distinct = len(set(bench._measuring_order(planned)))
    for stop in ("time limit", "Ctrl-C"):  # each in the second round
        calls.clear()
        deadline = clock.t + distinct + 0.5 if stop == "time limit" else None
        clock.interrupt_at = None if deadline else clock.t + distinct
        out = bench.measure_benchmark(planned, measure=Timer(), spec=SPEC, repeats=2, warmup=0,
                                      deadline=deadline)
        assert calls == [] and out[0].slowest_rank_direct_ms is None, stop


def test_each_runs_predicted_balance_is_by_its_own_cost():
    """pred max/mean judges each policy by what it balanced: tokens by Σ tokens, the
    baseline by its FLOPs (head included, as frameworks count them)."""
    from costmodel.flops import calculate_train_flops

    planned = bench.plan_benchmark(np.array([100, 2000, 300, 4000, 500, 600, 7000, 80]),
                                   spec=SPEC, cap=8192, dp_sizes=[2], policies=["tokens", "baseline"])
    runs = {r.policy: r for r in bench.measure_benchmark(planned, measure=fake_measure, spec=SPEC,
                                                          repeats=1, warmup=0)}
    for policy, cost in (("tokens", sum), ("baseline", lambda mb: calculate_train_flops(mb, SPEC))):
        run = runs[policy]
        expected = [float(sum(cost(mb) for mb in rank)) for rank in run.microbatch_lengths]
        assert run.predicted_own == pytest.approx(expected, rel=1e-12), policy


def test_warm_up_runs_the_largest_and_the_smallest_micro_batches_untimed():
    calls = []

    def counting(lengths):
        calls.append(tuple(lengths))
        return 1.0

    keys = [(5,), (1, 2), (9, 9), (4,)]
    times, _, _ = timer_mod.measure_microbatches(keys, counting, repeats=1, warmup=1)
    assert calls[:2] == [(9, 9), (1, 2)] and calls[2:] == keys
    assert set(times) == set(keys)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_a_measurer_returning_no_time_is_an_error(bad):
    """NaN, inf or a negative time is the measurer's failure, reported, never averaged in."""
    times, stopped, _ = timer_mod.measure_microbatches(
        [(3,), (4,)], lambda lengths: 2.0 if lengths == (3,) else bad, repeats=1, warmup=0)
    assert stopped == f"error: RuntimeError: the measurer returned {bad} ms for a micro-batch of 1 samples"
    assert times == {(3,): 2.0}


def test_the_noise_floor_is_that_of_a_perfectly_balanced_schedule():
    """Ranks are rescaled to the mean rank time first: an unbalanced schedule gets the floor
    of a balanced one with the same micro-batch structure, not its own imbalance."""
    unbalanced = timer_mod.noise_floor([[10.0] * 4, [20.0] * 4], 0.01)
    assert unbalanced == pytest.approx(timer_mod.noise_floor([[15.0] * 4] * 2, 0.01), rel=1e-12)
    assert 1.0 < unbalanced < 1.02


def test_layer_timer_needs_at_least_one_replay():
    pytest.importorskip("torch")
    tiny = ModelSpec(name="tiny", num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1,
                     head_dim=16, intermediate_size=64, vocab_size=64, dtype="fp32")
    with pytest.raises(ValueError, match="replays must be at least 1, got 0"):
        timer_mod.LayerTimer(tiny, attention="sdpa", dtype="fp32", device="cpu", replays=0)


def _report_runs():
    """dp 2: calibrated 19% below tokens and better than flops; dp 4: 5% below tokens,
    worse than flops, max/mean 1.056."""
    def run(policy, dp, measured, predicted=None, direct=None, noise=None, floor=None):
        return bench.PolicyRun(policy=policy, dp_size=dp, schedule=[[[0]]] * dp,
                               microbatch_lengths=[[[1]]] * dp, measured_ms=measured,
                               predicted_ms=predicted, predicted_own=[1.0] * dp,
                               slowest_rank_direct_ms=direct, timing_noise=noise, noise_floor=floor)

    return [run("tokens", 2, [10.0, 6.0], direct=9.9),
            run("flops", 2, [9.0, 8.0]),
            run("calibrated", 2, [8.1, 7.9], predicted=[8.5, 7.9], direct=8.262, noise=0.005,
                floor=1.01),
            run("tokens", 4, [10.0] * 4),
            run("flops", 4, [9.0] * 4),
            run("calibrated", 4, [9.5, 8.5, 9.0, 9.0])]


def test_the_report_table_and_its_notes():
    """speed-up = token balance's makespan / this one's; rank err % mean/worst; the noise
    floor of the calibrated policy and the end-to-end ratios' range are printed."""
    from costmodel.training.bench_report import format_report

    lines = format_report(_report_runs()).splitlines()
    assert lines[1].split() == ["2", "tokens", "1", "10.00", "1.250", "1.000x", "1.000", "-"]
    assert lines[3].split() == ["2", "calibrated", "1", "8.10", "1.012", "1.235x", "1.000", "2.5/4.9"]
    assert lines[6].split()[:6] == ["4", "calibrated", "1", "9.50", "1.056", "1.053x"]
    assert ("dp 2: timing noise ~0.5% per micro-batch; a perfectly balanced schedule of the "
            "calibrated policy's micro-batches would measure max/mean ~1.010") in lines
    assert lines[-1] == ("slowest rank timed end to end / sum of its micro-batches: 0.990 to "
                         "1.020 over 2 schedules")


def test_target_checks_per_dp_size():
    """The issue's targets: calibrated max/mean < 1.03, makespan >= 10% below tokens',
    no worse than flops; each judged per DP size, met or not."""
    from costmodel.training.bench_report import target_checks

    met, missed = target_checks(_report_runs())
    assert met["dp_size"] == 2 and missed["dp_size"] == 4
    assert met["makespan_cut_vs_tokens"] == pytest.approx(0.19)
    assert met["tokens_balance_headroom"] == pytest.approx(0.2)
    assert (met["max_over_mean_below_1.03"], met["cut_at_least_10pct"], met["no_worse_than_flops"]) \
        == (True, True, True)
    assert missed["makespan_cut_vs_tokens"] == pytest.approx(0.05)
    assert (missed["max_over_mean_below_1.03"], missed["cut_at_least_10pct"],
            missed["no_worse_than_flops"]) == (False, False, False)


def test_samples_of_a_lengths_file_and_the_recorded_config(tmp_path, capsys):
    """--samples N takes the file's first N (all of it when N is its size; 0 and more than
    it are refused); the JSON records it, and no samples per rank, for a fixed batch; the
    default rounds are 2 eagerly and 1 with graph timing (a median of replays already)."""
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("\n".join(str(n) for n in np.random.default_rng(1).integers(100, 9000, 40)))
    out = tmp_path / "b.json"
    base = ["--lengths", str(lengths), "--dp", "2", "--policies", "tokens", "-o", str(out)]
    assert _run([*base, "--samples", "10"]) == 0
    doc = json.loads(out.read_text())
    assert doc["batches"]["2"]["samples"] == 10
    assert doc["config"]["samples"] == 10 and doc["config"]["samples_per_rank"] is None
    assert doc["config"]["repeats"] == 2
    assert _run([*base, "--samples", "40", "--timing", "graph"]) == 0
    doc = json.loads(out.read_text())
    assert doc["batches"]["2"]["samples"] == 40 and doc["config"]["repeats"] == 1
    with pytest.raises(ValueError, match="--samples 41 but .* holds 40 lengths"):
        _run([*base, "--samples", "41"])
    with pytest.raises(ValueError, match="--samples must be in 1..10,000,000, got 0"):
        _run([*base, "--samples", "0"])


def test_samples_per_rank_are_limited_at_the_largest_dp_size():
    with pytest.raises(ValueError, match="--samples-per-rank 2000000 x the largest --dp 8 is "
                                         "more than the 10,000,000 samples drawn at most: "
                                         "lower --dp or --samples-per-rank"):
        _run(["--samples-per-rank", "2000000", "--dp", "1,8", "--policies", "tokens"])
    with pytest.raises(ValueError, match="--samples-per-rank must be at least 1, got 0"):
        _run(["--samples-per-rank", "0", "--dp", "8", "--policies", "tokens"])


def test_no_timing_note_when_the_cost_model_and_the_benchmark_time_alike(tmp_path, capsys):
    graph_timed = _graph_timed_profile(tmp_path)
    graph_gpu = _timed_gpu("graph")()
    argv = [*SMALL, "--cost-model", str(graph_timed), "--policies", "tokens,calibrated"]
    assert _run(argv, measure=graph_gpu) == 0
    assert "calibrated with" not in capsys.readouterr().err


def test_the_printed_targets_match_the_written_ones(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert _run([*SMALL, "--policies", ALL, "-o", str(out)]) == 0
    text = capsys.readouterr().out
    for t in json.loads(out.read_text())["targets"]:
        cut = 100 * t["makespan_cut_vs_tokens"]
        assert (f"dp {t['dp_size']}: calibrated max/mean {t['calibrated_max_over_mean']:.3f}; "
                f"makespan {abs(cut):.1f}% {'below' if cut >= 0 else 'ABOVE'} tokens") in text


@pytest.mark.parametrize("name, heads, expert_width", [
    ("h200/qwen3-30b-a3b-tp2", 16, 384), ("h200/qwen3-30b-a3b-tp1-etp4", 32, 192),
    ("h200/qwen3-30b-a3b", 32, 768)])
def test_the_layer_timed_is_the_shard_the_cost_model_prices(name, heads, expert_width,
                                                            monkeypatch, capsys):
    """Experts split at TP 1 (--expert-tensor-parallel alone) make a shard too: the layer
    timed is the cost model's rank_spec, not the whole layer."""
    spec, _ = _timer_built(monkeypatch, ["--model", "qwen3-30b-a3b", "--cost-model", name,
                                         "--dp", "2", "--samples", "64", "--cap", "131072"])
    assert (spec.num_heads, spec.moe_intermediate_size) == (heads, expert_width)


def _timer_built(monkeypatch, argv):
    """The spec and keyword arguments bench-schedule builds its GPU timer with (`argv`: its
    flags), stopping it there."""
    built = []

    class Stop(Exception):
        pass

    def fake_timer(spec, **kwargs):
        built.append((spec, kwargs))
        raise Stop

    monkeypatch.setattr(timer_mod, "LayerTimer", fake_timer)
    with pytest.raises(Stop):
        bench_schedule.run(build_parser().parse_args(["bench-schedule", *argv]))
    return built[0]


@pytest.mark.parametrize("device, key", [
    ("NVIDIA H200 NVL 141GB", "h200-nvl"),  # not the H200 SXM's measured profile
    ("NVIDIA H200", "h200"),
    ("NVIDIA GeForce RTX 4090 D", None),  # outside the registry
    (None, None),  # no GPU
])
def test_cost_model_auto_reads_the_device_name_as_calibrate_does(monkeypatch, device, key):
    """--cost-model auto names this GPU as `calibrate --gpu auto` does: a registered name
    plus its memory size is that GPU."""
    from costmodel.calibration import device as device_mod

    monkeypatch.setattr(device_mod, "current_gpu_name", lambda start_cuda=True: device)
    assert bench_schedule._detected_gpu_key() == key


# -- --mode forward and --align: the case simulate --mode forward --align 2 predicts --------


def fake_forward(lengths) -> float:
    """A stand-in GPU timing forward passes: the estimate's forward curves, 3% slower."""
    return 1.03 * TRUTH.stack_cost(list(lengths), "forward", num_layers=1, head=False)


def test_forward_mode_balances_and_predicts_by_the_forward_curves(tmp_path, capsys):
    """Every policy is built for a forward pass and judged by the forward curves: the
    calibrated schedule is the one the forward curves balance (not the train one, which
    differs on these batches), its predictions and own costs are forward ones."""
    from costmodel.scheduler import build_schedule, generate_lengths

    out = tmp_path / "forward.json"
    assert _run([*SMALL, "--policies", ALL, "--mode", "forward", "-o", str(out)],
                measure=fake_forward) == 0
    text = capsys.readouterr().out
    assert "qwen3-8b: one layer, mode forward (forward only, under no_grad), align 1" in text
    assert "one layer's forward time over its micro-batches" in text
    doc = json.loads(out.read_text())
    assert (doc["config"]["mode"], doc["config"]["align"]) == ("forward", 1)
    one = bench.OneLayerCost(TRUTH, moe=False)
    for r in doc["runs"]:  # forward predictions of forward measurements: 3% low everywhere
        assert np.allclose(r["rank_error_pct"], 100 * (1 / 1.03 - 1)), r["policy"]
        if r["policy"] != "calibrated":
            continue
        dp = r["dp_size"]
        lengths = generate_lengths(8 * dp, "rl", seed=0)
        built = {mode: build_schedule(lengths, dp_size=dp, max_tokens_per_microbatch=16384,
                                      cost=one, mode=mode).microbatches
                 for mode in ("forward", "train")}
        as_lengths = {mode: [[[int(lengths[i]) for i in mb] for mb in rank] for rank in sched]
                      for mode, sched in built.items()}
        assert r["microbatch_lengths"] == as_lengths["forward"] != as_lengths["train"]
        own = [sum(one.microbatch_cost(mb, "forward") for mb in rank)
               for rank in r["microbatch_lengths"]]
        assert r["own_cost_per_rank"] == pytest.approx(own, rel=1e-12)


def test_align_reaches_every_policy(tmp_path, capsys):
    """--align 3: every policy's ranks hold a multiple of 3 micro-batches (2 each without
    it, on these batches), the baseline's too; recorded and printed."""
    out = tmp_path / "aligned.json"
    assert _run([*SMALL, "--policies", ALL, "--align", "3", "-o", str(out)]) == 0
    assert "mode train (forward+backward), align 3" in capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert (doc["config"]["mode"], doc["config"]["align"]) == ("train", 3)
    assert {r["policy"] for r in doc["runs"]} == set(bench.POLICIES)
    for r in doc["runs"]:
        assert all(n > 0 and n % 3 == 0 for n in r["microbatches_per_rank"]), r["policy"]
    with pytest.raises(RuntimeError, match="a rank has 2 micro-batches, not a multiple of align 3"):
        bench.check_schedule([[[0], [1]], [[2], [3], [4]]], 5, 100, np.ones(5, int), "p", 3)


def test_layer_timer_runs_forward_only_in_forward_mode():
    """mode="forward": the layer runs under no_grad and no backward runs (no parameter
    gradient), as calibration timed the forward curves; "train" runs both."""
    torch = pytest.importorskip("torch")
    tiny, _ = _tiny_cpu_timer()
    for mode in ("forward", "train"):
        timer = timer_mod.LayerTimer(tiny, attention="sdpa", dtype="fp32", device="cpu", mode=mode)
        grad_enabled: list[bool] = []
        timer.layer.register_forward_hook(
            lambda *_, seen=grad_enabled: seen.append(torch.is_grad_enabled()))
        assert timer([40, 7]) > 0 and timer.measure_rank([[40, 7], [12]]) > 0
        grads = [p.grad is not None for p in timer.layer.parameters()]
        assert timer.describe()["mode"] == mode
        if mode == "forward":
            assert not any(grad_enabled) and not any(grads)
        else:
            assert all(grad_enabled) and all(grads)
    with pytest.raises(ValueError, match="mode must be one of"):
        timer_mod.LayerTimer(tiny, attention="sdpa", dtype="fp32", device="cpu", mode="fwd")


def test_the_command_times_the_layer_in_its_mode(monkeypatch):
    """--mode forward reaches the GPU timer; a measurer timing another pass is refused."""
    _, kwargs = _timer_built(monkeypatch, [*_with_truth(SMALL), "--mode", "forward"])
    assert kwargs["mode"] == "forward"

    class TrainTimer:
        mode = "train"

        def __call__(self, lengths):
            return fake_forward(lengths)

    with pytest.raises(ValueError, match="the measurer times 'train' passes but the schedules"):
        _run([*SMALL, "--mode", "forward"], measure=TrainTimer())


def test_a_cost_model_without_the_modes_curves_is_refused_before_the_gpu(tmp_path, capsys,
                                                                        monkeypatch):
    """--mode forward with a train-only cost model: one line naming what the file has and
    both fixes, before a timer is built."""
    def no_gpu_work(*args, **kwargs):
        raise AssertionError("a timer was built before the cost model was checked")

    monkeypatch.setattr(timer_mod, "LayerTimer", no_gpu_work)
    doc = json.loads(Path(_truth_file()).read_text())
    del doc["curves"]["forward"]
    train_only = tmp_path / "train.json"
    train_only.write_text(json.dumps(doc))
    assert main(["bench-schedule", "--samples-per-rank", "8", "--dp", "4", "--mode", "forward",
                 "--cost-model", str(train_only)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "has curves for train only; --mode forward times forward only" in err
    assert "calibrate with --modes forward" in err and "pick --mode train" in err
