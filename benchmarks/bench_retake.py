"""What measuring points again buys a calibration, on synthetic sweeps with the H200's noise.

    PYTHONPATH=. python benchmarks/bench_retake.py [--seeds 60]
        [--json benchmarks/results/bench_retake.json]

The noise between points comes from the stored H200 sweep behind the shipped profile
(eager timing): against a quadratic in tokens, its linear points from 2k tokens scatter
2.8% (training) and 5.2% (forward), with more of it slow than fast. Here a
`SyntheticShape` of known truth is calibrated by the pipeline `costmodel calibrate` runs,
every measurement (all its repeats) multiplied by one random factor: lognormal of that
spread, and one in 20 slowed by 5-25% besides. The pipeline's clock advances by each
measurement's synthetic GPU time (warm-ups and repeats, plus the plan's per-point
overhead), so the retakes' share of the sweep and its deadline bind as on the H200. Each
sweep runs with and without retakes, on the same draws, for a shape with an 8% GEMM step
at 12,288 tokens and one without. Judged against the truth (the same sweep without noise):

- the training linear curve's worst and rms error on 1k-16k tokens, and the fixed cost per
  layer's (from the whole-layer probes);
- the fill regret: the true cost per token, fixed cost included (the shipped profile's
  training 1.06 ms per layer and micro-batch), at the fill the scheduler's cheapest-fill
  start would take by the fitted model under a 16k cap (its cheapest fill where that is
  `_CHEAPER_FILL` below the cap's rate, else the cap), over the truth's cheapest; how often
  it takes one ("chased"); and the cap regret, what filling to the cap loses. A real step
  makes the cap lose; noise makes chasing lose;
- the seconds the retakes took, against the sweep's.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import costmodel.calibration.pipeline as pipeline  # noqa: E402
from costmodel.calibration.plan import PER_POINT_OVERHEAD_S, make_plan  # noqa: E402
from costmodel.calibration.timer import Measurement, SyntheticShape, SyntheticTimer  # noqa: E402
from costmodel.gpus import lookup_gpu  # noqa: E402
from costmodel.scheduler.bounds import cheapest_fill, cost_per_token  # noqa: E402
from costmodel.scheduler.costs import as_cost  # noqa: E402
from costmodel.scheduler.schedule import _CHEAPER_FILL  # noqa: E402
from costmodel.spec import ModelSpec  # noqa: E402

SPEC = ModelSpec.from_preset("qwen3-8b")
NOISE = (0.005, 0.028, 0.052)  # a quiet GPU; the H200 sweep's scatter: training, forward
SLOW_CHANCE, SLOW_BY = 0.05, (0.05, 0.25)
# The fixed cost per layer and micro-batch of the shipped profile's training pass (1.06 ms):
# what a fill below the cap pays for in more micro-batches.
SHAPES = {"8% step at 12,288": SyntheticShape(glue_ms=1.0),
          "no step": SyntheticShape(glue_ms=1.0, step=0.0)}
CAP = 16384
GRID = np.arange(1024, CAP + 1, 128)


class _Clock:
    """The pipeline's perf_counter, advanced by each measurement's synthetic GPU time."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


class _NoisyBetweenPoints:
    """A synthetic timer whose every measurement is off by one factor for all its repeats."""

    def __init__(self, shape: SyntheticShape, clock: _Clock, noise: float, seed: int):
        # within a measurement, the repeats scatter 0.5% (none for the truth)
        self.timer = SyntheticTimer(SPEC, shape, noise=0.005 if noise else 0.0, seed=seed)
        self.timing = self.timer.timing
        self.shape, self.clock, self.noise = shape, clock, noise
        self.rng = np.random.default_rng(seed + 1000)

    def measure(self, point, *, repeats: int, warmup: int) -> Measurement:
        truth = self.shape.point_ms(SPEC, point)
        self.clock.now += truth * (repeats + warmup) / 1e3 + PER_POINT_OVERHEAD_S
        m = self.timer.measure(point, repeats=repeats, warmup=warmup)
        factor = float(np.exp(self.rng.normal(0.0, self.noise))) if self.noise else 1.0
        if self.noise and self.rng.random() < SLOW_CHANCE:
            factor *= 1.0 + self.rng.uniform(*SLOW_BY)
        return dataclasses.replace(m, median_ms=m.median_ms * factor)

    def device_fingerprint(self) -> dict:
        return self.timer.device_fingerprint()


def _calibrate(shape: SyntheticShape, noise: float, seed: int, retakes: int):
    clock = _Clock()
    pipeline.time = clock  # type: ignore[assignment]  # the sweep's clock: synthetic GPU time
    plan = make_plan(SPEC, modes=("train",), max_len=16384, gpu="h200")
    plan.settings = dataclasses.replace(plan.settings, retakes=retakes)
    return pipeline.calibrate(SPEC, timer=_NoisyBetweenPoints(shape, clock, noise, seed),
                              plan=plan, gpu_key="h200", gpu_info=lookup_gpu("h200"),
                              attention="torch-varlen")


def _judge(model, truth) -> dict[str, float]:
    fitted = model.curves["train"].linear["dense"](GRID)
    true = truth.curves["train"].linear["dense"](GRID)
    miss = fitted / true - 1.0
    cost, true_cost = as_cost(model, mode="train"), as_cost(truth, mode="train")
    fill, rate = cheapest_fill(cost, CAP)
    # The scheduler's start fills there where the fitted curve says it is _CHEAPER_FILL
    # cheaper than the cap (its mean fill, roughly); else it fills to the cap.
    chased = rate <= float(cost_per_token(cost, np.array([CAP]))[0]) * (1 - _CHEAPER_FILL)
    best, best_rate = cheapest_fill(true_cost, CAP)
    true_rate = cost_per_token(true_cost, np.array([fill if chased else CAP, CAP]))
    retaken = model.provenance["retaken"]
    overhead = (model.curves["train"].layer_overhead_ms / truth.curves["train"].layer_overhead_ms
                - 1.0)
    return {"worst_error": float(np.abs(miss).max()), "rms_error": float(np.sqrt(np.mean(miss**2))),
            "overhead_error": abs(overhead),
            "fill": fill, "chased": bool(chased), "true_fill": best,
            "fill_regret": float(true_rate[0]) / best_rate - 1.0,
            "cap_regret": float(true_rate[1]) / best_rate - 1.0,
            "sweep_s": model.provenance["sweep_seconds"] - retaken["seconds"],
            "retake_s": retaken["seconds"], "retaken_points": retaken["points"],
            "retakes_measured": retaken["measurements"]}


def _median_p90(values: list[float]) -> dict[str, float]:
    return {"median": float(np.median(values)), "p90": float(np.quantile(values, 0.9))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=60)
    p.add_argument("--json", metavar="PATH", help="also write the table as JSON")
    args = p.parse_args(argv)
    logging.disable(logging.WARNING)  # drift and fit warnings: the noise is the point here
    real_time = pipeline.time
    rows = []
    print(f"synthetic qwen3-8b sweeps (training), {args.seeds} seeds; noise between points "
          f"lognormal + {SLOW_CHANCE:.0%} slowed {SLOW_BY[0]:.0%}-{SLOW_BY[1]:.0%}; cap {CAP}")
    print(f"{'shape':>18} {'noise':>6} {'retakes':>7} {'worst err':>16} {'rms err':>8} "
          f"{'overhead err':>12} {'chased':>6} {'fill regret':>16} {'cap regret':>10} "
          f"{'retake s / sweep s':>19}")
    try:
        for name, shape in SHAPES.items():
            truth = _calibrate(shape, 0.0, 0, 0)
            for noise in NOISE:
                for retakes in (0, 2):
                    cases = [_judge(_calibrate(shape, noise, seed, retakes), truth)
                             for seed in range(args.seeds)]
                    stats = {key: _median_p90([c[key] for c in cases])
                             for key in ("worst_error", "rms_error", "overhead_error",
                                         "fill_regret", "cap_regret", "retake_s", "sweep_s")}
                    chased = sum(c["chased"] for c in cases) / len(cases)
                    rows.append({"shape": name, "noise": noise, "retakes": retakes,
                                 "chased": chased, **stats, "cases": cases})
                    print(f"{name:>18} {noise:>6.1%} {retakes:>7} "
                          f"{stats['worst_error']['median']:>6.1%} (p90 {stats['worst_error']['p90']:>5.1%})"
                          f" {stats['rms_error']['median']:>8.2%}"
                          f" {stats['overhead_error']['median']:>12.1%} {chased:>6.0%} "
                          f"{stats['fill_regret']['median']:>6.2%} (p90 {stats['fill_regret']['p90']:>5.2%})"
                          f" {stats['cap_regret']['median']:>10.2%}"
                          f" {stats['retake_s']['median']:>8.1f} / {stats['sweep_s']['median']:.1f}")
    finally:
        pipeline.time = real_time
    if args.json:
        doc = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
               "machine": f"{platform.machine()}, Python {platform.python_version()}, "
                          f"numpy {np.__version__} (synthetic sweeps: no GPU, no timing)",
               "seeds": args.seeds, "cap": CAP, "noise_between_points": list(NOISE),
               "slow_chance": SLOW_CHANCE, "slow_by": list(SLOW_BY), "rows": rows}
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
