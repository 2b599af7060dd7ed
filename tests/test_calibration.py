"""The calibration pipeline on CPU: sweep -> fit -> check -> JSON -> load -> report -> validate,
with a synthetic timer of known shape (the same code path as the CUDA timer)."""

import dataclasses
import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest

import costmodel
from costmodel.calibration.pipeline import calibrate
from costmodel.calibration.plan import QUICK_SETTINGS, make_plan
from costmodel.calibration.report import format_report, plot_report
from costmodel.calibration.timer import SyntheticShape, SyntheticTimer
from costmodel.calibration.validate import format_validation, run_validation
from costmodel.gpus import lookup_gpu
from costmodel.model import load_cost_model
from costmodel.spec import ModelSpec

SPEC = ModelSpec.from_preset("qwen3-8b")
SHAPE = SyntheticShape()
H200 = lookup_gpu("h200")


def _calibrate(spec=SPEC, shape=SHAPE, *, noise=0.005, quick=False, max_len=16384, **kw):
    plan = make_plan(spec, quick=quick, max_len=max_len, gpu="h200")
    timer = SyntheticTimer(spec, shape, noise=noise, seed=1, **kw)
    return calibrate(spec, timer=timer, plan=plan, gpu_key="h200", gpu_info=H200,
                     attention="torch-varlen", command="test")


@pytest.fixture(scope="module")
def fitted():
    return _calibrate()


@pytest.mark.parametrize("mode", ["train", "forward"])
def test_fit_recovers_the_shape(fitted, mode):
    c = fitted.curves[mode]
    L = np.array([64, 100, 300, 1000, 3000, 10000, 16384])
    np.testing.assert_allclose(c.attention(L), SHAPE.attention_ms(SPEC, L, mode), rtol=0.03)
    # beyond the sweep: the L^2 tail stays close to a shape that is nearly L^2 there
    np.testing.assert_allclose(c.attention(np.array([32768])), SHAPE.attention_ms(SPEC, np.array([32768]), mode), rtol=0.06)
    for T in (16, 100, 700, 2000, 8000, 11000, 13000, 16384, 30000):
        truth = SHAPE.linear_ms(SPEC, T, mode, False)
        assert float(c.linear["dense"](T)) == pytest.approx(truth, rel=0.02), T
    for T in (16, 1000, 16384):
        assert float(c.head(T)) == pytest.approx(SHAPE.head_ms(SPEC, T, mode), rel=0.02)
    assert c.layer_overhead_ms == pytest.approx(SHAPE.glue_ms + SHAPE.call_ms(mode), abs=0.03)


def test_fit_keeps_the_gemm_step(fitted):
    lin = fitted.curves["train"].linear["dense"]
    below, above = SHAPE.step_at - 256, SHAPE.step_at + 256
    ratio = (float(lin(above)) / above) / (float(lin(below)) / below)
    assert ratio == pytest.approx(1 + SHAPE.step, abs=0.01)


def test_file_round_trip_and_contents(tmp_path, fitted):
    path = tmp_path / "calibrated.json"
    fitted.save(path)
    doc = json.loads(path.read_text())
    for key in ("device", "spec", "spec_fingerprint", "kernels", "measurements", "curves",
                "residuals", "flops_check", "validation", "created", "command", "provenance"):
        assert key in doc, key
    assert doc["device"]["name"] == "NVIDIA H200" and doc["kernels"]["attention"] == "torch-varlen"
    assert doc["flops_check"]["checked"] and 0.3 < doc["flops_check"]["max_efficiency"] <= 1.0
    assert doc["residuals"]["train"]["linear"]["rms"] < 0.02
    assert doc["provenance"]["kind"] == "synthetic"
    loaded = load_cost_model(path, spec=SPEC)
    assert not loaded.is_estimate
    lengths = np.array([5, 100, 1000, 8000, 40000])
    for mode in ("train", "forward"):
        np.testing.assert_allclose(loaded.sample_cost(lengths, mode), fitted.sample_cost(lengths, mode), rtol=1e-12)
        assert loaded.microbatch_cost([1000, 2000], mode) == pytest.approx(fitted.microbatch_cost([1000, 2000], mode))


def test_flops_check_catches_impossible_speed():
    fast = SyntheticShape(speedup=3.0)
    with pytest.raises(ValueError, match=r"broken measurement: .* faster than NVIDIA H200 can"):
        _calibrate(shape=fast, quick=True, max_len=4096)


def test_flops_check_counts_a_training_pass_as_three_forwards():
    """Forward + backward is 3x the forward's matmul FLOPs: a train point at twice the
    peak is impossible though its forward FLOPs alone would be under it, and one at 0.9x
    the peak passes."""
    from costmodel import flops
    from costmodel.calibration.check import flops_check
    from costmodel.calibration.fit import Record

    forward = float(flops.layer_linear_flops(4096, SPEC, moe=False))
    at = lambda share: 3 * forward / (share * H200.peak_bf16_flops) * 1e3  # noqa: E731
    flops_check([Record("linear", "train", (4096,), at(0.9))], SPEC,
                peak_flops=H200.peak_bf16_flops, gpu_name="H200")
    with pytest.raises(ValueError, match="broken measurement"):
        flops_check([Record("linear", "train", (4096,), at(2.0))], SPEC,
                    peak_flops=H200.peak_bf16_flops, gpu_name="H200")
    # The edge: within 5% over the peak passes (clock boost, rounding), 10% over does not.
    flops_check([Record("linear", "train", (4096,), at(1.04))], SPEC,
                peak_flops=H200.peak_bf16_flops, gpu_name="H200")
    with pytest.raises(ValueError, match="broken measurement"):
        flops_check([Record("linear", "train", (4096,), at(1.10))], SPEC,
                    peak_flops=H200.peak_bf16_flops, gpu_name="H200")


@pytest.mark.parametrize("ms", [-1.0, 0.0, float("nan")])
def test_a_timer_returning_an_impossible_time_stops_the_sweep(ms):
    # -1 ms fitted silently (the FLOPs check passed a negative efficiency); 0 was a
    # ZeroDivisionError, NaN scipy's "must not contain infs or NaNs".
    from costmodel.calibration.timer import Measurement

    class Broken(SyntheticTimer):
        def measure(self, point, *, repeats=5, warmup=1):
            real = super().measure(point, repeats=repeats, warmup=warmup)
            broken = point.kind == "linear" and self.calls > 1  # the first call: the probe
            return Measurement(ms, real.spread, repeats) if broken else real

    plan = make_plan(SPEC, quick=True, max_len=2048, gpu="h200")
    timer = Broken(SPEC, SHAPE, noise=0.005, seed=1)
    with pytest.raises(ValueError, match="the timer's result for linear .* is impossible"):
        calibrate(SPEC, timer=timer, plan=plan, gpu_key="h200", gpu_info=H200,
                  attention="torch-varlen", command="test")


def test_a_drift_probe_timed_at_zero_at_the_end_is_named_not_a_division_by_zero():
    """The probe's second timing, after every point: 0 ms was a ZeroDivisionError."""
    from costmodel.calibration.timer import Measurement

    plan = make_plan(SPEC, quick=True, max_len=2048, gpu="h200")
    plan.settings = dataclasses.replace(plan.settings, retakes=0)  # the probe: the last call
    last_call = len(plan.points) + 2

    class ZeroAtTheEnd(SyntheticTimer):
        def measure(self, point, *, repeats=5, warmup=1):
            real = super().measure(point, repeats=repeats, warmup=warmup)
            return Measurement(0.0, real.spread, repeats) if self.calls == last_call else real

    timer = ZeroAtTheEnd(SPEC, SHAPE, noise=0.005, seed=1)
    with pytest.raises(ValueError, match="the drift probe's timer result for linear .* is impossible"):
        calibrate(SPEC, timer=timer, plan=plan, gpu_key="h200", gpu_info=H200,
                  attention="torch-varlen", command="test")


@pytest.mark.parametrize("peak", [0.0, float("nan"), -1e15, "989e12", True])
def test_flops_check_needs_a_real_peak(peak):
    from costmodel.calibration.check import flops_check
    from costmodel.calibration.fit import Record

    records = [Record("linear", "train", (4096,), 1e-6)]  # impossibly fast
    with pytest.raises(ValueError, match="peak_flops must be a finite number > 0"):
        flops_check(records, SPEC, peak_flops=peak, gpu_name="x")


def test_flops_check_counts_each_kind_s_own_work_and_lists_it_by_length():
    """Attention: the core FLOPs of every sequence in the pack; linear: one layer's
    projections + MLP or MoE experts; head: per token x tokens; layer: attention + linear.
    Rows are per kind/mode (MoE apart), sorted by length, then pack size; efficiency is
    achieved / peak and max_efficiency the highest of them."""
    from costmodel import flops
    from costmodel.calibration.check import flops_check
    from costmodel.calibration.fit import Record

    spec = ModelSpec.from_preset("qwen3-30b-a3b")
    peak = 1e18  # nothing comes near it
    attn = lambda n, L: float(flops.attention_core_flops([L] * n, spec).sum())  # noqa: E731
    records = [  # (record, its forward FLOPs)
        (Record("attention", "train", (1024,) * 2, 2.0), attn(2, 1024)),
        (Record("attention", "train", (512,) * 4, 1.0), attn(4, 512)),
        (Record("attention", "train", (512,), 0.5), attn(1, 512)),
        (Record("linear", "forward", (2048,), 4.0), float(flops.layer_linear_flops(2048, spec, moe=False))),
        (Record("linear", "train", (2048,), 4.0, moe=True), float(flops.layer_linear_flops(2048, spec, moe=True))),
        (Record("head", "train", (1000,), 0.25), 1000 * float(flops.lm_head_flops_per_token(spec))),
        (Record("layer", "forward", (300, 700), 3.0),
         attn(1, 300) + attn(1, 700) + float(flops.layer_linear_flops(1000, spec, moe=False))),
    ]
    out = flops_check([r for r, _ in records], spec, peak_flops=peak, gpu_name="H200")
    assert set(out["points"]) == {"attention train", "linear forward", "linear moe train",
                                  "head train", "layer forward"}
    assert [(row["length"], row["n"]) for row in out["points"]["attention train"]] == [(512, 1), (512, 4), (1024, 2)]
    want = {}
    for r, fwd in records:
        want[(r.kind, r.moe, r.mode, r.ms)] = flops.pass_factor(r.mode) * fwd / (r.ms * 1e-3)
    got = {}
    for key, rows in out["points"].items():
        kind, mode = key.split()[0], key.split()[-1]
        for row in rows:
            got[(kind, "moe" in key, mode, row["ms"])] = row["tflops"] * 1e12
            assert row["efficiency"] == pytest.approx(row["tflops"] * 1e12 / peak)
    assert got.keys() == want.keys()
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-12), key
    assert out["max_efficiency"] == pytest.approx(max(want.values()) / peak)


def test_an_impossible_point_is_named_the_worst_first():
    """Every point over the peak counts; the error names the fastest of them: kind, length
    and pack size (attention) or tokens, mode, time and share of the peak."""
    from costmodel import flops
    from costmodel.calibration.check import flops_check
    from costmodel.calibration.fit import Record

    peak = H200.peak_bf16_flops
    at = lambda fwd, passes, share: passes * fwd / (share * peak) * 1e3  # noqa: E731
    linear = float(flops.layer_linear_flops(4096, SPEC, moe=False))
    attention = float(flops.attention_core_flops([1024] * 8, SPEC).sum())
    records = [Record("linear", "train", (4096,), at(linear, 3, 1.5)),
               Record("attention", "forward", (1024,) * 8, at(attention, 1, 2.0)),
               Record("linear", "forward", (4096,), at(linear, 1, 0.5))]
    with pytest.raises(ValueError, match=r"broken measurement: 2 point\(s\) run faster than H200 "
                       r"can; worst attention L=1024 n=8 \(forward\) .* 200% of the"):
        flops_check(records, SPEC, peak_flops=peak, gpu_name="H200")
    with pytest.raises(ValueError, match=r"1 point\(s\) .* worst linear T=4096 \(train\) .* 150% of the"):
        flops_check(records[:1] + records[2:], SPEC, peak_flops=peak, gpu_name="H200")


def test_flops_check_tolerance_is_a_finite_number_and_zero_is_strict():
    """Points up to `tolerance` over the peak pass (clock boost, rounding), past it fail."""
    from costmodel import flops
    from costmodel.calibration.check import flops_check
    from costmodel.calibration.fit import Record

    peak = H200.peak_bf16_flops
    ms = lambda share: float(flops.layer_linear_flops(4096, SPEC, moe=False)) / (share * peak) * 1e3  # noqa: E731
    records = [Record("linear", "forward", (4096,), ms(1.01))]  # 1% over
    assert flops_check(records, SPEC, peak_flops=peak, gpu_name="H200")["max_efficiency"] == pytest.approx(1.01)
    with pytest.raises(ValueError, match="broken measurement"):
        flops_check(records, SPEC, peak_flops=peak, gpu_name="H200", tolerance=0.0)
    with pytest.raises(ValueError, match="broken measurement"):  # the default 5%, not more
        flops_check([Record("linear", "forward", (4096,), ms(1.07))], SPEC, peak_flops=peak, gpu_name="H200")
    flops_check([Record("linear", "forward", (4096,), ms(1.07))], SPEC, peak_flops=peak, gpu_name="H200",
                tolerance=0.08)
    for bad in (float("nan"), float("inf"), -0.01):  # NaN would pass every point
        with pytest.raises(ValueError, match="tolerance must be a finite number >= 0"):
            flops_check(records, SPEC, peak_flops=peak, gpu_name="H200", tolerance=bad)


@pytest.mark.parametrize("drift, warns", [(0.2, True), (-0.2, True), (0.08, True), (0.02, False)])
def test_drift_probe_warns_past_five_percent_either_way(caplog, drift, warns):
    """A GPU that sped up over the sweep (clocks ramping from idle) is as suspect as one
    that slowed down (thermal throttling)."""
    with caplog.at_level(logging.WARNING, logger="costmodel.calibration.pipeline"):
        m = _calibrate(quick=True, max_len=2048, noise=0.002, drift=drift, expected_calls=50)
    assert ("drift probe" in caplog.text) is warns
    probe = m.provenance["drift_probe"]
    assert probe["warning"] is warns
    # end / start - 1: positive when the GPU slowed down over the sweep
    assert probe["relative_change"] == pytest.approx(probe["end_ms"] / probe["start_ms"] - 1)
    assert (probe["relative_change"] > 0) is (drift > 0)


def test_residuals_are_predicted_over_measured_minus_one(fitted):
    from costmodel.calibration.fit import Record, residuals

    c = fitted.curves["train"]
    records = [Record("linear", "train", (t,), float(c.linear["dense"](t)) / 1.25)
               for t in (512, 1024, 2048)]
    assert residuals(c, records, 0.0)["linear"]["relative"] == pytest.approx([0.25] * 3, abs=1e-4)
    for mode, kinds in fitted.extra["residuals"].items():  # a clean synthetic shape: small
        assert kinds["attention"]["rms"] < 0.05, mode


def test_moe_model_gets_moe_curves():
    spec = ModelSpec.from_preset("qwen3-30b-a3b")
    m = _calibrate(spec, quick=True, max_len=4096)
    assert set(m.curves["train"].linear) == {"moe"}
    truth = SHAPE.linear_ms(spec, 3000, "train", True)
    assert float(m.curves["train"].linear["moe"](3000)) == pytest.approx(truth, rel=0.03)


def test_plan_is_budgeted():
    for quick, budget in ((False, 75), (True, 24)):
        plan = make_plan(SPEC, quick=quick, max_len=32768, gpu="h200")
        assert plan.estimated_s <= budget
        assert plan.summary().startswith(f"{len(plan.points)} points")
    full = make_plan(SPEC, max_len=32768, gpu="h200", budget_s=1e6)
    slightly = make_plan(SPEC, max_len=32768, gpu="h200", budget_s=full.estimated_s * 0.97)
    assert slightly.settings.repeats == full.settings.repeats - 1  # a repeat goes first,
    assert len(slightly.points) == len(full.points)  # before the grid gets coarser
    assert slightly.settings.linear_step == full.settings.linear_step
    tight = make_plan(SPEC, max_len=32768, gpu="h200", budget_s=20)
    assert tight.notes and len(tight.points) < len(make_plan(SPEC, max_len=32768, gpu="h200").points)
    with pytest.raises(ValueError, match="modes"):
        make_plan(SPEC, modes=("eval",))
    # A GPU outside the registry is planned with H200 rates, and the plan says so.
    assert "not in the GPU registry" in make_plan(SPEC, gpu="mystery-gpu").notes[0]
    assert not [n for n in make_plan(SPEC, gpu="h100").notes if "registry" in n]


def test_plan_counts_the_calls_each_timing_makes():
    """Eagerly a point runs its warm-ups and repeats; as a CUDA graph at least two warm-ups
    (the first backward only creates .grad), the upload replay and the repeats."""
    from costmodel.calibration.plan import PER_POINT_OVERHEAD_S, plan_seconds
    from costmodel.estimate import estimate_cost_model
    from costmodel.gpus import lookup_gpu

    plan = make_plan(SPEC, quick=True, max_len=4096, gpu="h200", timing="eager")
    model = estimate_cost_model(SPEC, lookup_gpu("h200"))
    overhead = PER_POINT_OVERHEAD_S * len(plan.points)
    work = {t: plan_seconds(plan.points, model, plan.settings, t) - overhead
            for t in ("eager", "graph")}
    s = plan.settings  # quick: 1 warm-up, 3 repeats
    assert work["graph"] / work["eager"] == pytest.approx((2 + 1 + s.repeats) / (1 + s.repeats))


def test_report_and_plot(tmp_path, fitted):
    text = format_report(fitted)
    assert "synthetic: qwen3-8b on NVIDIA H200" in text and "FLOPs check: passed" in text
    assert "ESTIMATE" not in text
    assert f"costmodel={costmodel.__version__}" in text  # whose sweep it was
    assert fitted.label.endswith("(synthetic)")  # simulate's "judged by:" line: no "measured"
    # the attention call's own cost by length, one line per pass, from the fit's record
    assert len(re.findall(r"attention per-call cost a\(L\).*: 64: [0-9.]+, ", text)) == 2, text
    png = plot_report(fitted, str(tmp_path / "plot.png"))
    assert (tmp_path / "plot.png").stat().st_size > 10_000 and png.endswith(".png")


def test_report_says_where_a_micro_batch_is_cheapest_per_token(fitted):
    """The fill the scheduler's cheapest-fill start aims at: below the cap where the curve
    steps (the shipped profile's training: 10.5k of 16k; the synthetic shape's 8% step at
    12,288 tokens), the cap itself where it does not (the registry estimate)."""
    from costmodel.model import load_cost_model

    lines = [x for x in format_report(load_cost_model("h200/qwen3-8b")).splitlines()
             if "cheapest per token" in x]
    assert lines[0] == ("  cheapest per token, fixed cost included: 10,496 tokens under a 16k cap "
                        "(-6.1% per token), 17,920 tokens under a 32k cap (-1.8% per token)")
    assert len(lines) == 2  # a line a pass
    synthetic = next(x for x in format_report(fitted).splitlines() if "cheapest per token" in x)
    # below the step (where within it, the fit's 0.3% noise decides: 11,264 here)
    assert re.search(r"1[12],\d{3} tokens under a 16k cap \(-[4-8]\.\d% per token\)", synthetic)
    estimate = next(x for x in format_report(load_cost_model("h100/qwen3-8b")).splitlines()
                    if "cheapest per token" in x)
    assert "16,384 tokens under a 16k cap (full)" in estimate


def test_validation_with_synthetic_timer(fitted):
    timer = SyntheticTimer(SPEC, SHAPE, noise=0.005, seed=7)
    block = run_validation(fitted, timer, count=60, num_layers=2, modes=["train"])
    s = block["modes"]["train"]["summary"]
    assert s["all"]["cost_model"]["mape"] < 0.02
    assert s[">=1024"]["cost_model"]["mape"] < 0.02
    assert s["all"]["cost_model"]["mape"] < s["all"]["tokens"]["mape"]
    assert s["all"]["cost_model"]["spearman"] > 0.99
    assert "cost_model" in format_validation(block)


def test_plan_measures_the_coarse_grid_first():
    plan = make_plan(SPEC, quick=True, max_len=8192, gpu="h200")
    coarse = plan.points[: plan.essential]
    assert 0 < plan.essential < len(plan.points)
    for mode in ("train", "forward"):
        assert any(p.kind == "layer" and p.mode == mode for p in coarse)
        for kind in ("attention", "linear", "head"):
            every = [p for p in plan.points if p.mode == mode and p.kind == kind]
            first = [p for p in coarse if p.mode == mode and p.kind == kind]
            # the coarse grid spans the whole range of every curve
            assert max(p.length for p in first) == max(p.length for p in every)
            assert min(p.length for p in first) == min(p.length for p in every)
    # an attention length keeps all its packs together (the per-call fit needs them)
    for L in {p.length for p in coarse if p.kind == "attention"}:
        packs = [p for p in plan.points if p.kind == "attention" and p.mode == "train" and p.length == L]
        assert all(p in coarse for p in packs)


class _Clock:
    """A stand-in clock (`perf_counter`) that the tests advance by 1 s per measurement."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def test_deadline_skips_refinements_only(monkeypatch):
    import costmodel.calibration.pipeline as pipeline

    clock = _Clock()
    monkeypatch.setattr(pipeline, "time", clock)
    timer = SyntheticTimer(SPEC, SHAPE, noise=0.005, seed=1)
    real_measure = timer.measure

    def measure(point, **kw):
        clock.now += 1.0
        return real_measure(point, **kw)

    timer.measure = measure
    plan = make_plan(SPEC, quick=True, max_len=8192, gpu="h200", budget_s=10)  # deadline 12 s
    m = calibrate(SPEC, timer=timer, plan=plan, gpu_key="h200", gpu_info=H200, attention="torch-varlen")
    assert len(m.extra["measurements"]) == plan.essential
    assert m.provenance["skipped_points"] == len(plan.points) - plan.essential
    assert set(m.modes) == {"train", "forward"}
    lin = m.curves["train"].linear["dense"]
    assert float(lin(8000)) == pytest.approx(SHAPE.linear_ms(SPEC, 8000, "train", False), rel=0.1)


def test_interrupted_sweep_saves_measurements_and_refits(tmp_path):
    from costmodel.calibration.pipeline import PARTIAL_SCHEMA, refit

    plan = make_plan(SPEC, quick=True, max_len=4096, gpu="h200")
    timer = SyntheticTimer(SPEC, SHAPE, noise=0.005, seed=1)
    real_measure = timer.measure
    # interrupted once the coarse grid of train is measured, before any forward point
    train_points = next(i for i, p in enumerate(plan.points) if p.mode == "forward")

    def measure(point, **kw):
        if timer.calls > train_points:  # + 1: the drift probe
            raise KeyboardInterrupt
        return real_measure(point, **kw)

    timer.measure = measure
    saved = []
    with pytest.raises(KeyboardInterrupt):
        calibrate(SPEC, timer=timer, plan=plan, gpu_key="h200", gpu_info=H200, attention="torch-varlen",
                  save_partial=saved.append)
    (doc,) = saved
    assert doc["schema"] == PARTIAL_SCHEMA and doc["error"].startswith("KeyboardInterrupt")
    assert len(doc["measurements"]) == train_points
    partial = refit(json.loads(json.dumps(doc)), source="partial.json")
    assert partial.modes == ["train"] and "forward" in partial.provenance["dropped_modes"]
    assert partial.provenance["refit"]["from"] == "partial.json"


def test_refit_of_a_complete_file_reproduces_it(tmp_path, fitted):
    from costmodel.calibration.pipeline import refit
    from costmodel.cli import main

    path = tmp_path / "cal.json"
    fitted.save(path)
    again = refit(json.loads(path.read_text()), source=str(path))
    L = np.array([100, 1000, 10000])
    for mode in ("train", "forward"):
        np.testing.assert_allclose(again.sample_cost(L, mode), fitted.sample_cost(L, mode), rtol=1e-12)
    assert again.provenance["drift_probe"] == fitted.provenance["drift_probe"]
    assert main(["calibrate", "--refit", str(path), "-o", str(tmp_path / "re.json")]) == 0
    assert load_cost_model(tmp_path / "re.json", spec=SPEC).modes == ["train", "forward"]
    with pytest.raises(ValueError, match="cannot refit"):
        refit({"schema": "costmodel/1"}, source="x.json")



@pytest.mark.parametrize("kernels", [-1, 1.5, "torch-varlen", [["attention", "sdpa"]]])
def test_refit_names_a_kernels_field_that_is_not_an_object(fitted, kernels):
    """A hand-edited "kernels" went to dict(): a number raised TypeError (a traceback from
    `calibrate --refit`), a string a ValueError about "dictionary update sequence" (an
    audit)."""
    from costmodel.calibration.pipeline import refit

    doc = dict(fitted.to_dict(), kernels=kernels)
    with pytest.raises(ValueError, match=r"x\.json: cannot refit: its 'kernels' .* is not an "
                       "object"):
        refit(doc, source="x.json")



def test_refit_weighs_a_wild_layer_probe_without_overflowing(fitted):
    """A stored layer probe's weight was 1 / (ms × spread)²: squaring a spread of 1e300
    raised OverflowError, and an ms of 1e-200 squared to 0, a ZeroDivisionError: tracebacks
    from `calibrate --refit` (an audit). The noisy probe now weighs next to nothing; the
    impossibly fast one reaches the FLOPs check, which names it."""
    from costmodel.calibration.pipeline import refit

    def with_probe(field, value):
        doc = json.loads(json.dumps(fitted.to_dict()))
        probe = next(m for m in doc["measurements"] if m["kind"] == "layer" and m["mode"] == "train")
        probe[field] = value
        return doc

    again = refit(with_probe("spread", 1e300), source="x.json")
    overhead = again.to_dict()["curves"]["train"]["overhead"]["per_layer_ms"]
    assert overhead == pytest.approx(fitted.to_dict()["curves"]["train"]["overhead"]["per_layer_ms"],
                                     rel=0.05)
    with pytest.raises(ValueError, match="faster than"):
        refit(with_probe("ms", 1e-200), source="x.json")


def test_validation_stops_at_its_time_limit(monkeypatch, fitted):
    import time

    clock = _Clock()
    monkeypatch.setattr(time, "perf_counter", clock.perf_counter)
    timer = SyntheticTimer(SPEC, SHAPE, noise=0.005, seed=7)
    real_measure = timer.measure

    def measure(point, **kw):
        clock.now += 1.0
        return real_measure(point, **kw)

    timer.measure = measure
    block = run_validation(fitted, timer, count=40, num_layers=2, time_limit_s=10)
    assert block["stopped_at_time_limit"] and block["count"] == 6 and block["requested_count"] == 40
    assert [len(block["modes"][m]["points"]) for m in ("train", "forward")] == [6, 6]
    assert "stopped at the time limit" in format_validation(block)


def test_validation_micro_batches_are_varied_at_every_cap():
    """Lengths are drawn below each cap, not clipped to it: clipping made most micro-batches
    of a 768-token cap the same single 768-token sequence."""
    from collections import Counter

    from costmodel.calibration.validate import random_microbatches, rl_lengths

    rng = np.random.default_rng(0)
    mbs = random_microbatches(rng, count=150, caps=(768, 2048, 4096, 8192, 16384), max_len=32768)
    assert max(Counter(mbs).values()) <= 2
    small = [mb for mb in mbs if sum(mb) <= 768]
    assert sum(1 for mb in small if mb == (768,)) <= 1
    drawn = rl_lengths(rng, 20000, 768)
    assert drawn.min() >= 16 and drawn.max() <= 768 and (drawn == 768).mean() < 0.01


def test_inputs_that_hung_or_planned_for_a_month_are_refused():
    from costmodel.calibration.validate import random_microbatches

    rng = np.random.default_rng(0)
    for caps, max_len in (((0,), 4096), ((2048,), 0)):  # a cap of 0 never closed a batch
        with pytest.raises(ValueError, match="caps and max_len must be integers >= 16"):
            random_microbatches(rng, count=5, caps=caps, max_len=max_len)
    with pytest.raises(ValueError, match="max_len must be an integer number of tokens"):
        make_plan(SPEC, max_len=2**31)  # ran for minutes, estimated 31 days
    plan = make_plan(SPEC, quick=True, max_len=2048, modes=("train", "train"))
    assert {p.mode for p in plan.points} == {"train"}
    assert len(plan.points) == len(make_plan(SPEC, quick=True, max_len=2048, modes=("train",)).points)


def test_registry_names_and_estimates_by_name():
    from costmodel.estimate import estimate_cost_model
    from costmodel.gpus import find_gpu_by_device_name

    assert find_gpu_by_device_name("NVIDIA H100 80GB HBM3 144GB", allow_suffix=True).key == "h100"
    # A MIG slice is a fraction of the GPU: not the whole GPU's peak (7x off for 1g).
    assert find_gpu_by_device_name("NVIDIA H100 80GB HBM3 MIG 1g.10gb", allow_suffix=True) is None
    with pytest.raises(ValueError, match="device name is a string"):
        find_gpu_by_device_name(None)
    assert estimate_cost_model("qwen3-8b", "h200").spec == SPEC  # by preset name, as everywhere


def test_validation_count_and_a_mode_given_as_text(fitted):
    timer = SyntheticTimer(SPEC, SHAPE, noise=0.005, seed=7)
    with pytest.raises(ValueError, match="count >= 4"):  # measured everything, then failed
        run_validation(fitted, timer, count=2, num_layers=1)
    with pytest.raises(ValueError, match="at most 10,000"):  # what revalidate draws within
        run_validation(fitted, timer, count=10**11, num_layers=1)
    result = run_validation(fitted, timer, count=4, caps=(2048,), modes="train", num_layers=1)
    assert list(result["modes"]) == ["train"]  # not "t", "r", "a", ...


def _with_validation(model):
    """The model's file with a validation block (the shared fixture is left as it is)."""
    timer = SyntheticTimer(SPEC, SHAPE, noise=0.005, seed=11)
    doc = model.to_dict()
    doc["validation"] = run_validation(model, timer, count=12, num_layers=2, caps=[2048, 8192])
    return doc


def test_a_refit_judges_the_stored_validation_again(fitted):
    """The GPU's validation times hold for any fit of the same sweep: a refit keeps them and
    predicts them with its own curves, from the stored lengths or from the seed."""
    from costmodel.calibration.pipeline import refit

    doc = _with_validation(fitted)
    refitted = refit(doc, source="test")
    block = refitted.extra["validation"]
    assert block["revalidated"] and "refitted curves" in format_validation(block)
    for mode in ("train", "forward"):
        old, new = doc["validation"]["modes"][mode]["points"], block["modes"][mode]["points"]
        assert [p["measured_ms"] for p in new] == [p["measured_ms"] for p in old]
        for p in new:
            assert p["predicted_ms"] == pytest.approx(
                refitted.stack_cost(p["lengths"], mode, num_layers=2), rel=1e-12)
    # a file whose points store no lengths: drawn again from the seed, same micro-batches
    for res in doc["validation"]["modes"].values():
        for p in res["points"]:
            del p["lengths"]
    assert refit(doc, source="test").extra["validation"]["modes"] == block["modes"]


def test_a_validation_that_cannot_be_judged_again_is_dropped(fitted, caplog):
    from costmodel.calibration.pipeline import refit

    doc = _with_validation(fitted)
    for res in doc["validation"]["modes"].values():
        for p in res["points"]:
            del p["lengths"]
    doc["validation"]["seed"] += 1  # other micro-batches than the points
    assert refit(doc, source="test").extra["validation"] is None
    assert "cannot be judged again" in caplog.text
    # A layer count no model has (an audit's 1e300 judged every point NaN in `correct`):
    doc = _with_validation(fitted)
    doc["validation"]["num_layers"] = 1e300
    assert refit(doc, source="test").extra["validation"] is None
    assert "num_layers 1000000000000" in caplog.text


def test_the_shipped_h200_validation_replays_exactly():
    """The shipped profile stored no lengths; its seed with the sampler of that time draws
    the same 120 micro-batches, and its own curves give back its stored figures."""
    from costmodel.calibration.validate import revalidate

    model = load_cost_model("h200/qwen3-8b")
    stored = model.extra["validation"]
    block = revalidate(model, stored)
    for mode in ("train", "forward"):
        for split in ("all", ">=1024"):
            got, want = (b["modes"][mode]["summary"][split]["cost_model"] for b in (block, stored))
            assert got["mape"] == pytest.approx(want["mape"], rel=1e-9)
            assert got["worst"] == pytest.approx(want["worst"], rel=1e-9)


@pytest.mark.parametrize("field, value, says", [
    ("requested_count", 10**9, "requested_count 1000000000 is not between its 120 points"),
    ("caps", [2**31 - 1], "caps [2147483647] go past the 32,768 tokens the model measured"),
])
def test_a_block_without_lengths_is_not_drawn_again_past_a_validate_run_s_bounds(
        field, value, says, caplog):
    """A block whose points store no lengths is drawn again from its seed: edited to ask
    for 10**9 micro-batches, or a cap of 2**31 tokens, `calibrate --refit` and `correct`
    drew for hours. It is dropped, with a warning that says why."""
    import copy

    from costmodel.calibration.validate import revalidate

    model = load_cost_model("h200/qwen3-8b")
    block = copy.deepcopy(model.extra["validation"])
    for res in block["modes"].values():
        for point in res["points"]:
            point.pop("lengths", None)
    block[field] = value
    assert revalidate(model, block) is None
    assert says in caplog.text


def test_a_validation_of_modes_the_refit_lacks_is_dropped(caplog):
    from costmodel.calibration.validate import revalidate

    model = load_cost_model("h200/qwen3-8b")
    block = dict(model.extra["validation"])
    block["modes"] = {"forward": block["modes"]["forward"]}
    model.curves.pop("forward")  # as a refit whose forward fit failed
    assert revalidate(model, block) is None
    assert "validated forward, which the model lacks" in caplog.text


def test_a_quick_plan_over_budget_still_thins_its_grids():
    """The first thinning step (a repeat fewer) does nothing to a quick plan, whose repeats
    are at their floor: the grids are thinned next (the plan stopped there, unthinned)."""
    spec = ModelSpec.from_preset("qwen3-32b")
    plan = make_plan(spec, quick=True, max_len=32768, gpu="h200")
    assert any("thinned" in n for n in plan.notes)
    assert plan.settings.linear_step > QUICK_SETTINGS.linear_step
    notes = make_plan(SPEC, quick=True, max_len=32768, gpu="h200", budget_s=1).notes
    assert len(notes) == len(set(notes))  # no step repeated once at its floor


# -- from a mutation check: each test fails when the code it names is broken ---------------


def test_plan_packs_run_from_one_to_cap_over_length_and_the_default_cap():
    """attention packs of n = 1
    .. max_tokens // L sequences; max_tokens defaults to max(max_len, 16384)."""
    from costmodel.calibration.plan import make_plan

    plan = make_plan(SPEC, quick=True, max_len=4096, gpu="h200")
    assert plan.max_tokens == 16384
    assert max(p.tokens for p in plan.points if p.kind == "linear") == 16384
    packs: dict[int, set[int]] = {}
    for p in plan.points:
        if p.kind == "attention" and p.mode == "train":
            packs.setdefault(p.length, set()).add(p.n)
    assert max(packs) == 4096
    for L, ns in packs.items():
        assert min(ns) == 1 and max(ns) == 16384 // L, (L, sorted(ns))


def test_plan_attention_lengths_are_log_spaced():
    """about attention_per_octave lengths per octave, 64 .. max_len."""
    from costmodel.calibration.plan import make_plan

    plan = make_plan(SPEC, max_len=32768, gpu="h200")
    per_octave = plan.settings.attention_per_octave
    lengths = sorted({p.length for p in plan.points if p.kind == "attention"})
    assert lengths[0] == 64 and lengths[-1] == 32768
    assert abs(len(lengths) - (9 * per_octave + 1)) <= 1, (per_octave, lengths)
    assert np.diff(np.log2(lengths)).max() < 1.5 / per_octave


def test_progress_line_every_tenth_with_time_left():
    """off a terminal, a line per 10% of the work; the time
    left is elapsed / done x what is left."""
    import io

    from costmodel.calibration.plan import SweepPoint
    from costmodel.calibration.progress import ProgressLine

    buf = io.StringIO()
    line = ProgressLine(buf, "calibrate")
    point = SweepPoint("linear", "train", (1024,))
    for done in range(1, 101):
        line(done, 100, point, done * 0.5)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 11
    assert any("[  50/100]" in ln and "~  25 s left" in ln for ln in lines), lines


def test_report_tflops_and_efficiency_columns():
    """TFLOP/s = pass factor (train 3) x FLOPs / time, and
    efficiency = that / the GPU's peak, for the attention and the linear tables."""
    from costmodel import flops
    from costmodel.calibration.report import format_report
    from costmodel.gpus import lookup_gpu
    from costmodel.model import load_cost_model

    m = load_cost_model("h200/qwen3-8b")
    peak = lookup_gpu("h200").peak_bf16_flops
    train = format_report(m).split("[train]")[1].split("[forward]")[0]
    c = m.curves["train"]
    ms, tf, eff = map(float, re.search(r"^\s+8192\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%", train, re.M).groups())
    want = 3 * float(flops.attention_core_flops([8192], m.spec)[0]) / (float(c.attention(np.array([8192]))[0]) * 1e-3)
    assert tf == pytest.approx(want / 1e12, abs=0.06) and eff / 100 == pytest.approx(want / peak, abs=6e-4)
    row = re.search(r"^\s+8192\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%", train, re.M)
    ms, _, tf, eff = map(float, row.groups())
    want = 3 * float(flops.layer_linear_flops(8192, m.spec, moe=False)) / (float(c.linear["dense"](8192)) * 1e-3)
    assert tf == pytest.approx(want / 1e12, abs=0.06) and eff / 100 == pytest.approx(want / peak, abs=6e-4)


def test_rank_correlation_is_spearmans():
    """a monotone but non-linear predictor has rank correlation 1."""
    from costmodel.calibration.validate import error_metrics

    m = error_metrics(np.array([1.0, 2, 3, 4, 100]), np.array([1.0, 2, 3, 4, 5]))
    assert m["spearman"] == pytest.approx(1.0)


def test_the_1k_split_includes_1024_tokens():
    """'>=1024' holds micro-batches of exactly 1024 tokens."""
    from costmodel.calibration.validate import summarize

    measured = np.array([1.0, 2, 3, 4])
    out = summarize(measured, {"cost_model": measured}, np.array([1024, 1024, 512, 2048]))
    assert out[">=1024"]["cost_model"]["count"] == 3


def test_refit_keeps_the_measuring_command_and_records_its_own():
    """a refit's file still names the command that measured; the refit's
    command goes to provenance.refit."""
    from costmodel.calibration.pipeline import refit

    doc = json.loads((Path(__file__).resolve().parents[1] / "costmodel" / "profiles" / "h200"
                      / "qwen3-8b.json").read_text())
    m = refit(doc, source="x.json", command="costmodel calibrate --refit x.json -o y.json")
    assert m.extra["command"] == doc["command"]
    assert m.provenance["refit"]["command"] == "costmodel calibrate --refit x.json -o y.json"


def test_progress_on_a_terminal_redraws_one_line_and_ends_it(monkeypatch):
    """On a terminal the line is redrawn in place ('\\r') at most every 0.2 s, and the last
    one (the work done) is always drawn and ends with a newline."""
    import io

    import costmodel.calibration.progress as progress
    from costmodel.calibration.plan import SweepPoint

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    clock = {"now": 1000.0}
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock["now"])
    buf = Terminal()
    line = progress.ProgressLine(buf, "calibrate")
    point = SweepPoint("linear", "train", (1024,))
    for done in range(1, 51):  # all within the same instant: the first and the last drawn
        line(done, 50, point, done * 0.1)
    out = buf.getvalue()
    assert out.count("\r") == 2 and out.startswith("\r") and out.endswith("\n")
    assert "[   1/50]" in out and "[  50/50]" in out and "\n" not in out[:-1]
    buf.truncate(0)
    buf.seek(0)
    line = progress.ProgressLine(buf, "calibrate")
    for done in range(1, 5):  # 0.25 s apart: each drawn
        clock["now"] += 0.25
        line(done, 10, point, done * 0.25)
    assert buf.getvalue().count("\r") == 4


def test_plan_attention_lengths_stay_within_max_len_that_is_no_multiple_of_8():
    """Lengths are rounded to multiples of 8, but none past --max-len (1005 rounds up to
    1008) and --max-len itself is measured."""
    plan = make_plan(SPEC, quick=True, max_len=1005, gpu="h200")
    lengths = sorted({p.length for p in plan.points if p.kind == "attention"})
    assert lengths[0] == 64 and lengths[-1] == 1005, lengths
    assert all(L % 8 == 0 for L in lengths[:-1]), lengths


def test_plan_bounds_and_deadline():
    """Lengths and caps of 64 .. 1M tokens only, a cap at least the longest sequence, and
    refinements skipped past 1.2 x the budget, as the summary says."""
    for kw, says in ((dict(max_len=32), "max_len must be an integer number of tokens in 64.."),
                     (dict(max_len=1024, max_tokens=63), "max_tokens must be an integer number"),
                     (dict(max_len=8192, max_tokens=4096), r"max_tokens \(4096\) must be >= max_len \(8192\)")):
        with pytest.raises(ValueError, match=says):
            make_plan(SPEC, quick=True, **kw)
    plan = make_plan(SPEC, quick=True, max_len=2048, budget_s=10)
    assert plan.deadline_s == pytest.approx(12.0)
    assert plan.summary().endswith("(budget 10 s, refinements skipped past 12 s)")


def test_a_stack_point_records_its_layer_count():
    """A validation micro-batch runs `num_layers` layers + head: its record says how many
    (the time of 4 layers is not the time of 1)."""
    from costmodel.calibration.plan import SweepPoint

    d = SweepPoint("stack", "train", (100, 300), num_layers=4).to_dict()
    assert d == {"kind": "stack", "mode": "train", "tokens": 400, "lengths": [100, 300], "num_layers": 4}
    assert "num_layers" not in SweepPoint("layer", "train", (100, 300)).to_dict()


def test_a_stack_point_costs_its_layers_and_the_head():
    """`point_ms` of a stack: num_layers x (layer overhead + attention + linear) + head."""
    from costmodel.calibration.plan import SweepPoint, point_ms
    from costmodel.estimate import estimate_cost_model

    c = estimate_cost_model(SPEC, "h200").curves["train"]
    lengths = (100, 300)
    layer = point_ms(c, SweepPoint("layer", "train", lengths), call_ms=0.0)
    assert layer == pytest.approx(c.layer_overhead_ms + float(c.attention(np.array(lengths)).sum())
                                  + float(c.linear["dense"](400)))
    stack = point_ms(c, SweepPoint("stack", "train", lengths, num_layers=4), call_ms=0.0)
    assert stack == pytest.approx(4 * layer + float(c.head(400)))


def test_plan_head_probe_and_repeat_floors():
    """The LM head is measured up to `head_max_tokens` only (above, extrapolated), the drift
    probe is no larger than the cap, and thinning never takes a median of fewer than three
    repeats (a quick plan starts there)."""
    plan = make_plan(SPEC, max_len=32768, gpu="h200")
    assert max(p.tokens for p in plan.points if p.kind == "head") == plan.settings.head_max_tokens
    assert make_plan(SPEC, quick=True, max_len=1024, max_tokens=1024).probe.tokens == 1024
    tight = make_plan(ModelSpec.from_preset("qwen3-32b"), quick=True, max_len=32768, gpu="h200")
    assert any("thinned" in n for n in tight.notes) and tight.settings.repeats == 3


def test_validation_shows_where_the_error_sits_by_size():
    """The shipped H200 validation, by micro-batch size: the launch-bound small micro-batches
    carry the error, the token cap's full ones are within a few percent."""
    from costmodel.model import load_cost_model

    text = format_validation(load_cost_model("h200/qwen3-8b").extra["validation"])
    line = next(x for x in text.splitlines() if x.startswith("  train: cost model error by"))
    assert "< 1k 40.3% (31)" in line and ">= 8k 1.4% (24)" in line
    assert "error by" not in format_validation({"modes": {"train": {"summary": {}, "points": [
        {"tokens": 5}]}}})  # points without figures: no line, no error


def test_validation_shows_how_far_identical_micro_batches_scatter():
    """The shipped H200 validation drew single samples at a cap more than once: their times
    say what error the measurement alone gives (its points keep no lengths: n = 1's are
    its tokens). A block that keeps lengths groups several-sample micro-batches too."""
    from costmodel.model import load_cost_model

    text = format_validation(load_cost_model("h200/qwen3-8b").extra["validation"])
    line = next(x for x in text.splitlines() if x.startswith("  train: identical"))
    assert "< 1k 7.2% (15 in 1 group; alone, ~5.7% error)" in line
    assert ">= 1k 2.3% (22 in 3 groups; alone, ~1.8% error)" in line
    points = [{"tokens": 3000, "n": 2, "lengths": [1000, 2000], "measured_ms": ms}
              for ms in (9.0, 11.0)] + [{"tokens": 3000, "n": 2, "lengths": [1500, 1500],
                                         "measured_ms": 30.0}]
    line = format_validation({"modes": {"train": {"summary": {}, "points": points}}})
    assert "train: identical micro-batches measured apart scatter: >= 1k 14.1% (2 in 1 group" in line
    assert "identical" not in format_validation({"modes": {"train": {"summary": {}, "points": [
        {"tokens": 5, "n": 1, "measured_ms": 1.0}]}}})  # no size measured twice: no line


def test_a_hand_edited_validation_point_skips_the_scatter_not_the_table():
    """A review found: a point that is not an object raised an AttributeError the scatter
    did not catch (`report` then hid the whole validation), and a time of 0 ms printed a
    scatter of "nan%" (a negative one, a scatter of times no GPU measured)."""
    block = json.loads(json.dumps(load_cost_model("h200/qwen3-8b").extra["validation"]))
    block["modes"]["train"]["points"].append(5)
    text = format_validation(block)
    assert "  train    all     cost_model   13.20%" in text and "  train: identical" not in text
    assert "  forward: identical micro-batches measured apart scatter: < 1k 15.3%" in text
    for bad in (0.0, -1.0):
        points = [{"tokens": 768, "n": 1, "measured_ms": ms} for ms in (1.0, 1.1, bad)]
        assert "identical" not in format_validation({"modes": {"train": {"summary": {},
                                                                         "points": points}}})


def test_a_fit_that_floors_short_attention_still_loads(tmp_path):
    """The fit floors a short length's per-sequence attention at 10 ns where the packs'
    times are all per-call cost (a split of the time, not a speed: 10x the H200's peak at
    L=64). The load-time peak check judges each curve at its largest knot, so what
    calibrate writes loads; checking every knot refused it."""
    from costmodel.calibration.pipeline import refit

    doc = json.loads(Path("costmodel/profiles/h200/qwen3-8b.json").read_text())
    short = [d for d in doc["measurements"] if d["kind"] == "attention" and d["length"] == 64
             and d["mode"] == "train"]
    for d in short:  # every pack as slow as the slowest: no per-sequence cost to fit
        d["ms"] = max(x["ms"] for x in short)
    model = refit(doc, source="floored")
    assert model.curves["train"].attention.ms[0] == pytest.approx(1e-5)
    model.save(tmp_path / "floored.json")
    assert load_cost_model(tmp_path / "floored.json").curves["train"].attention.ms[0] == \
        pytest.approx(1e-5)
