"""Fits of the token-linear curve, judged on runs the fit never saw (computed on the CPU).

    PYTHONPATH=. python benchmarks/bench_token_fits.py [--profile h200/qwen3-8b]
        [--bench-schedule benchmarks/results/bench_schedule_h200.json]
        [--json benchmarks/results/bench_token_fits_h200.json]

A calibration measures each token count of the linear curve once, a few repeats back to
back: the noise between neighbouring counts (2.8% training, 5.2% forward in the H200 sweep
behind the shipped profile) is far above each point's spread, and the monotone fit through
the points (`calibration.fit.token_knots`) keeps it as flats and jumps, which the scheduler
then fills to. Three fits of the profile's own linear points, each put in place of the
profile's linear curve (fixed costs, attention and head as they are):

- ``isotonic``: the shipped fit;
- ``spline``: a smoothing spline of log time on log tokens, its smoothness by generalised
  cross-validation (scipy's `make_smoothing_spline`), made monotone;
- ``spline+steps``: the same plus level shifts where they pay for themselves (optimal
  partitioning of the spline's residuals with the Bayesian information criterion's penalty,
  2 sigma^2 ln n a shift, sigma from each point's miss from its neighbours; a shift holds
  over 3 points at least), so that a real GEMM step can stay.

Each is judged by its mean absolute error on the runs stored beside the profile on the same
GPU (the profile's `costmodel validate` stacks, 4 layers and the LM head; with
``--bench-schedule``, every rank a `costmodel bench-schedule` run measured, one layer), and
by where a micro-batch is then cheapest per token (fixed cost included) under a 16k cap.
Then the same fits on synthetic sweeps of known truth (the H200 sweep's noise: lognormal
2.8%, one point in 20 slowed 5-25%; 20 seeds), with a real step of 0, 3 and 6% from 12,032
tokens: each fit's rms error, and how much of the step it keeps (the truth's cost per token
at 16,384 over that at 11,776, against the fit's).
"""

from __future__ import annotations

import argparse
import copy
import logging
import math
import sys
from pathlib import Path

import numpy as np
from scipy.interpolate import make_smoothing_spline
from scipy.optimize import isotonic_regression

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_correction import bench_schedule_runs  # noqa: E402
from benchmarks.bench_scheduler import write_cases  # noqa: E402
from costmodel.calibration.correct import Run, part_times, validation_runs  # noqa: E402
from costmodel.calibration.fit import Record, token_knots  # noqa: E402
from costmodel.curves import MODES, TokenCurve  # noqa: E402
from costmodel.model import CostModel, load_cost_model  # noqa: E402

SEEDS = 20
STEPS = (0.0, 0.03, 0.06)
MIN_STEP_POINTS = 3


def spline(tokens: np.ndarray, ms: np.ndarray) -> np.ndarray:
    """Smoothing spline of log ms on log tokens (smoothness by GCV), made monotone."""
    x, y = np.log(tokens), np.log(ms)
    return isotonic_regression(np.exp(make_smoothing_spline(x, y)(x)), increasing=True).x


def spline_steps(tokens: np.ndarray, ms: np.ndarray) -> np.ndarray:
    """The spline plus the level shifts the residuals bear out (BIC), made monotone."""
    x, y = np.log(tokens), np.log(ms)
    penalty = 2.0 * _scatter(x, y) ** 2 * math.log(y.size)
    shifts = np.zeros_like(y)
    for _ in range(3):  # the spline again without the shifts, so it does not bend into one
        smooth = make_smoothing_spline(x, y - shifts)(x)
        shifts = _level_shifts(y - smooth, penalty, MIN_STEP_POINTS)
    return isotonic_regression(np.exp(smooth + shifts), increasing=True).x


def _scatter(x: np.ndarray, y: np.ndarray) -> float:
    """One point's noise: its miss from the line through its neighbours, scaled (Gasser,
    Sargent and Sorensen's pseudo-residuals), as a median absolute deviation."""
    left, right = x[1:-1] - x[:-2], x[2:] - x[1:-1]
    a, b = right / (left + right), left / (left + right)
    miss = (a * y[:-2] + b * y[2:] - y[1:-1]) / np.sqrt(a * a + b * b + 1.0)
    return float(1.4826 * np.median(np.abs(miss - np.median(miss))))


def _level_shifts(r: np.ndarray, penalty: float, min_len: int) -> np.ndarray:
    """Piecewise-constant fit of ``r`` (runs of at least ``min_len``) minimising squared
    error plus ``penalty`` a run: optimal partitioning."""
    n = r.size
    s1 = np.concatenate(([0.0], np.cumsum(r)))
    s2 = np.concatenate(([0.0], np.cumsum(r * r)))
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    start = np.zeros(n + 1, dtype=np.int64)
    for j in range(min_len, n + 1):
        starts = np.arange(j - min_len + 1)
        cost = best[starts] + s2[j] - s2[starts] - (s1[j] - s1[starts]) ** 2 / (j - starts) + penalty
        k = int(np.argmin(cost))
        start[j], best[j] = starts[k], cost[k]
    out = np.empty(n)
    j = n
    while j > 0:
        i = int(start[j])
        out[i:j] = (s1[j] - s1[i]) / (j - i)
        j = i
    return out


FITS = {"spline": spline, "spline+steps": spline_steps}


def refitted(model: CostModel, records: list[Record], fit) -> CostModel:
    """``model`` with each pass's dense linear curve fitted again by ``fit`` from its points."""
    out = copy.deepcopy(model)
    for mode in model.modes:
        points = [r for r in records if r.mode == mode and r.kind == "linear" and not r.moe]
        tokens, measured, _ = token_knots(points, f"{mode} linear", warn=False)
        out.curves[mode].linear["dense"] = TokenCurve(tokens, fit(tokens, measured))
    out._tables.clear()  # priced from the new curves
    return out


def held_out_errors(model: CostModel, runs: dict[str, list[Run]]) -> dict[str, float]:
    """Mean absolute error on each set of runs, by pass (validation: also >= 1k tokens)."""
    out = {}
    for name, rs in runs.items():
        for mode in MODES:
            mine = [r for r in rs if r.mode == mode]
            if not mine:
                continue
            predicted = part_times(model, mine).sum(axis=1)
            error = np.abs(predicted / np.array([r.ms for r in mine]) - 1)
            out[f"{name} {mode}"] = float(error.mean())
            if name == "validation":
                big = np.array([sum(map(sum, r.microbatches)) >= 1024 for r in mine])
                out[f"{name} {mode} >= 1k"] = float(error[big].mean())
    return out


def cheapest_fills(model: CostModel, cap: int = 16384) -> dict[str, list[float]]:
    """Per pass, the fill cheapest per token (fixed cost included) under ``cap``, and how
    much cheaper per token than a full micro-batch it is."""
    fills = np.arange(1, cap + 1, dtype=np.float64)
    out = {}
    for mode in model.modes:
        rate = (model.fixed_cost(mode) + model.token_costs(fills, mode)) / fills
        best = int(np.argmin(rate))
        out[mode] = [best + 1, float(1 - rate[best] / rate[-1])]
    return out


def synthetic(seeds: int = SEEDS) -> list[dict]:
    """Each fit on sweeps of known truth with the H200 sweep's noise, with a real step."""
    tokens = np.arange(1024, 32769, 256, dtype=np.float64)
    near, far = np.searchsorted(tokens, 11776), np.searchsorted(tokens, 16384)
    rows = []
    for step in STEPS:
        truth = tokens * 2e-3 * (1 + 0.05 * np.exp(-tokens / 3000)) * np.where(
            tokens >= 12032, 1 + step, 1.0)
        per_fit: dict[str, list[tuple[float, float]]] = {}
        for seed in range(seeds):
            rng = np.random.default_rng(seed)
            slow = np.where(rng.random(tokens.size) < 0.05, rng.uniform(1.05, 1.25, tokens.size), 1)
            ms = truth * rng.lognormal(0.0, 0.028, tokens.size) * slow
            points = [Record("linear", "train", (int(t),), float(x), 0.02) for t, x in zip(tokens, ms)]
            t, measured, mono = token_knots(points, "synthetic", warn=False)
            for name, fitted in [("isotonic", mono),
                                 *((n, f(t, measured)) for n, f in FITS.items())]:
                rms = float(np.sqrt(np.mean((fitted / truth - 1) ** 2)))
                kept = (fitted[far] / tokens[far]) / (fitted[near] / tokens[near]) - 1
                per_fit.setdefault(name, []).append((rms, float(kept)))
        true_step = (truth[far] / tokens[far]) / (truth[near] / tokens[near]) - 1
        for name, got in per_fit.items():
            rows.append({"step": step, "fit": name, "true_per_token_step": float(true_step),
                         "rms_error_median": float(np.median([g[0] for g in got])),
                         "per_token_step_median": float(np.median([g[1] for g in got]))})
    return rows


def _measure(profile: str, bench_schedule: str | None, seeds: int) -> tuple[list[dict], list[dict]]:
    """The held-out rows (printed as they come) and the synthetic rows."""
    model = load_cost_model(profile)
    records = [Record.from_dict(d) for d in model.extra["measurements"]]
    runs = {"validation": validation_runs(model)}
    if bench_schedule:
        runs["bench-schedule"] = bench_schedule_runs(Path(bench_schedule))
    rows = []
    for name, fitted in [("isotonic", model),
                         *((n, refitted(model, records, f)) for n, f in FITS.items())]:
        mape, fills_16k = held_out_errors(fitted, runs), cheapest_fills(fitted)
        rows.append({"fit": name, "mape": mape, "cheapest_fill_16k": fills_16k})
        errors = "  ".join(f"{k} {v:.2%}" for k, v in mape.items())
        fills = "  ".join(f"{m}: {f:,.0f} tokens {g:.1%} under the cap"
                          for m, (f, g) in fills_16k.items())
        print(f"{name:13} {errors}\n{'':13} cheapest under 16k: {fills}")
    print("\nsynthetic sweeps (2.8% noise, 1 in 20 slowed 5-25%; medians of "
          f"{seeds} seeds): rms error, cost per token at 16,384 over 11,776 (the truth's)")
    made = synthetic(seeds)
    for row in made:
        print(f"  step {row['step']:.0%}  {row['fit']:13} rms {row['rms_error_median']:.2%}  "
              f"step kept {row['per_token_step_median']:+.1%} "
              f"(truth {row['true_per_token_step']:+.1%})")
    return rows, made


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="h200/qwen3-8b",
                   help="a calibrated file with its measurements and validation (default: "
                   "h200/qwen3-8b)")
    p.add_argument("--bench-schedule", metavar="PATH",
                   help="a `costmodel bench-schedule` result measured on the same GPU")
    p.add_argument("--seeds", type=int, default=SEEDS,
                   help=f"synthetic sweeps per step (default: {SEEDS})")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    logging.disable(logging.WARNING)  # each refit's notes
    try:
        rows, made = _measure(args.profile, args.bench_schedule, args.seeds)
    finally:
        logging.disable(logging.NOTSET)  # main() may run inside a test session
    if args.json:
        write_cases(args.json, rows, profile=args.profile, bench_schedule=args.bench_schedule,
                    synthetic=made)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
