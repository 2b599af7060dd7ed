"""Fitting: per-call/per-sequence separation, monotone token curves that keep steps."""

import numpy as np
import pytest

from costmodel.calibration.fit import Record, fit_attention, fit_token_curve
from costmodel.calibration.validate import best_scale, error_metrics


def test_attention_fit_separates_call_and_sequence_cost():
    a = 0.03
    b = lambda L: 1e-8 * L**2 + 2e-6 * L
    recs = []
    for L in (64, 256, 1024, 4096, 16384):
        for n in sorted({1, max(1, 16384 // L // 2), 16384 // L}):
            recs.append(Record("attention", "train", (L,) * n, a + n * b(L)))
    curve, call_ms, details = fit_attention(recs)
    assert call_ms == pytest.approx(a, rel=1e-6)
    L = np.array([64, 256, 1024, 4096])
    np.testing.assert_allclose(curve(L), b(L), rtol=1e-6)
    assert details["single_pack_lengths"] == [16384]  # only n=1 fits there: uses median a
    assert float(curve(16384)) == pytest.approx(b(16384), rel=1e-6)
    assert float(curve(32768)) == pytest.approx(4 * b(16384), rel=1e-9)  # L^2 tail


def test_attention_fit_is_monotone_under_noise():
    rng = np.random.default_rng(0)
    recs = []
    for L in (64, 96, 128, 192, 256, 384, 512):
        for n in (1, 4, 16):
            recs.append(Record("attention", "forward", (L,) * n, (0.02 + n * 1e-6 * L) * rng.lognormal(0, 0.05)))
    curve, _, _ = fit_attention(recs)
    assert np.all(np.diff(curve(np.arange(1, 2000))) >= 0)
    assert np.all(curve.ms > 0)


def test_token_curve_keeps_a_step_and_pools_a_dip():
    T = np.arange(1024, 20000, 256)
    per_token = np.where(T >= 11776, 1.06e-3, 1e-3)
    ms = T * per_token
    ms[5] *= 0.9  # one noisy point below its left neighbour
    recs = [Record("linear", "train", (int(t),), float(x), 0.01) for t, x in zip(T, ms)]
    curve = fit_token_curve(recs, "test")
    assert np.all(np.diff(curve.ms) >= 0)
    before, after = float(curve(11520)) / 11520, float(curve(12032)) / 12032
    assert after / before == pytest.approx(1.06, abs=0.005)  # the step survives
    assert float(curve(16000)) == pytest.approx(16000 * 1.06e-3, rel=1e-9)
    # A point below its left neighbour is pooled with it (their mean), not lifted to it.
    T = [1000, 2000, 3000, 4000, 5000]
    dip = fit_token_curve([Record("linear", "train", (t,), x, 0.01)
                           for t, x in zip(T, [1.0, 2.1, 1.9, 3.0, 4.0])], "test")
    assert dip.ms[1] == dip.ms[2] == pytest.approx(2.0)


def test_best_scale_minimises_mape():
    rng = np.random.default_rng(3)
    x = rng.uniform(1, 100, 200)
    y = 2.5 * x * rng.lognormal(0, 0.2, 200) + rng.uniform(0, 30, 200)
    s = best_scale(x, y)
    grid = np.linspace(0.5 * s, 1.5 * s, 2001)
    mape = [np.mean(np.abs(g * x / y - 1)) for g in grid]
    assert np.mean(np.abs(s * x / y - 1)) <= min(mape) + 1e-12
    m = error_metrics(2 * y, y)
    assert m["mape"] == pytest.approx(1.0) and m["spearman"] == pytest.approx(1.0)
    # the largest error either way: -50% here, not the +2%
    assert error_metrics(np.array([1.0, 4.0, 3.06]), np.array([2.0, 4.0, 3.0]))["worst"] == pytest.approx(0.5)


def test_a_per_call_cost_never_fits_below_zero():
    """Packs whose time grows a little faster than n (a graph-timed call costs ~0, plus
    noise) make the least-squares intercept negative: NNLS keeps it at 0."""
    recs = [Record("attention", "forward", (L,) * n, n * b + extra * b)
            for L, b in ((512, 0.05), (1024, 0.1), (2048, 0.2))
            for n, extra in ((1, 0.0), (2, 0.01), (4, 0.05))]
    _, call_ms, details = fit_attention(recs)
    assert call_ms >= 0 and min(details["per_call_ms"].values()) >= 0


def test_a_noisy_point_yields_to_a_precise_one():
    """Points are pooled weighted by 1/spread^2: a noisy point above a precise neighbour
    takes that neighbour's value, not the mean of the two."""
    recs = [Record("linear", "train", (100,), 1.0, spread=0.5)] + [
        Record("linear", "train", (t,), ms, spread=0.01) for t, ms in ((200, 0.8), (300, 1.0), (400, 1.2))]
    assert float(fit_token_curve(recs, "test")(100)) == pytest.approx(0.8, rel=0.01)


@pytest.mark.parametrize("slow", [1.3, 2.0, 5.0])
def test_one_slow_pack_does_not_tilt_attention(slow):
    # Two pack sizes at the longest lengths: a slow n=1 pack put the time into a(L) and cut
    # b(L) by 30-64% (b = 0 at 5x), and the L^2 tail with it.
    a = 0.06
    b = lambda L: 1e-7 * L**2
    recs = []
    for L in (1024, 2048, 4096, 8192):
        for n in (1, 2) if L == 8192 else (1, 4, 16):
            ms = a + n * b(L)
            recs.append(Record("attention", "train", (L,) * n, ms * (slow if (L, n) == (8192, 1) else 1)))
    curve, call_ms, details = fit_attention(recs)
    assert call_ms == pytest.approx(a, rel=1e-6)
    assert details["refit_with_median_call_lengths"] == [8192]
    # Through the median a, from the pack the slowdown spared.
    assert float(curve(8192)) == pytest.approx(b(8192), rel=1e-6)
    assert float(curve(16384)) == pytest.approx(4 * b(8192), rel=1e-6)


@pytest.mark.parametrize("where", [-1, 20])
def test_a_slow_token_point_is_not_a_step(where):
    # One point 10x slow set the whole tail when last (curve 10x too high from there on) and
    # a flat +180% shelf after it inside the grid.
    T = np.arange(1024, 16385, 512)
    ms = T * 1e-3
    ms[where] *= 10
    recs = [Record("linear", "train", (int(t),), float(x), 0.01) for t, x in zip(T, ms)]
    curve = fit_token_curve(recs, "test")
    for t in (T[where], T[where] + 100 if where >= 0 else 2 * T[-1]):
        assert float(curve(t)) == pytest.approx(t * 1e-3, rel=0.01)


def test_a_per_call_tail_that_grows_with_length_is_not_a_slow_pack():
    """Graph timing leaves a call cost of microseconds, while the kernel's tail (one long
    sequence's last blocks) still grows with L: a trend, not a slow measurement."""
    call = 0.004
    b = lambda L: 1e-7 * L**2 + 2e-5 * L
    tail = lambda L: max(0.0, 2.7e-5 * (L - 2048))  # ~6-12% of one sequence, as on an H200
    recs = []
    for L in (512, 1024, 2048, 4096, 8192, 16384):
        for n in (1, 2, 4):
            recs.append(Record("attention", "forward", (L,) * n, call + tail(L) + n * b(L), 0.01))
    curve, call_ms, details = fit_attention(recs)
    assert details["refit_with_median_call_lengths"] == []
    L = np.array([4096.0, 8192.0, 16384.0])
    np.testing.assert_allclose(curve(L), b(L), rtol=1e-6)  # b is not biased by the tail
    assert details["per_call_ms"]["16384"] == pytest.approx(call + tail(16384), rel=1e-6)


def test_a_stack_measurement_is_not_a_sweep_point():
    """validate's stacks (layers + head) are stored with its results; one among a file's
    measurements is named, not fitted as something else (a bare "no prediction" before)."""
    import pytest

    d = {"kind": "stack", "mode": "train", "lengths": [100, 200], "ms": 1.0}
    with pytest.raises(ValueError, match="kind 'stack' is not measured by a calibration sweep"):
        Record.from_dict(d)
    assert Record.from_dict({**d, "kind": "layer"}).tokens == 300


def test_token_fits_benchmark_on_the_stored_h200_runs(tmp_path, load_benchmark):
    """benchmarks/bench_token_fits.py end to end (2 synthetic seeds): on runs the fit never
    saw, a smooth linear curve predicts the stored H200 times better than the monotone fit
    through the points, and the training curve's cheapest fill under 16k moves to the cap;
    on synthetic sweeps the smooth fit's error is lower and it keeps less of a real step."""
    import json
    import logging

    bench = load_benchmark("bench_token_fits")
    out = tmp_path / "fits.json"
    assert bench.main(["--bench-schedule", str(bench.ROOT / "benchmarks/results/bench_schedule_h200.json"),
                       "--seeds", "2", "--json", str(out)]) == 0
    assert logging.root.manager.disable == logging.NOTSET  # the tests after it log again
    doc = json.loads(out.read_text())
    fits = {row["fit"]: row for row in doc["cases"]}
    shipped, smooth = fits["isotonic"], fits["spline"]
    for held_out in ("validation train >= 1k", "validation forward >= 1k", "bench-schedule train"):
        assert smooth["mape"][held_out] < shipped["mape"][held_out]
    assert shipped["cheapest_fill_16k"]["train"][0] == 10496
    assert smooth["cheapest_fill_16k"]["train"][0] == 16384
    six = {row["fit"]: row for row in doc["synthetic"] if row["step"] == 0.06}
    assert six["spline"]["rms_error_median"] < six["isotonic"]["rms_error_median"]
    assert six["spline"]["per_token_step_median"] < six["isotonic"]["per_token_step_median"]
