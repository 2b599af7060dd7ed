"""What a per-part correction (`costmodel correct`) does to the shipped H200 profile, judged
on the H200's stored measurements.

    PYTHONPATH=. python benchmarks/bench_correction.py
        [--json benchmarks/results/bench_correction_h200.json]

Two sets of runs measured on the H200 in the 2026-11-30 session, both eager-timed:
- `validation`: the profile's own `costmodel validate` block, 120 random micro-batches per
  pass, each through 4 layers and the LM head;
- `bench-schedule`: every simulated rank of `benchmarks/results/bench_schedule_h200.json`
  (352 ranks: 4 policies at dp 8, 16 and 64, cap 16k), its micro-batches through one layer,
  no head, training passes.

For each, and for the shipped profile and the registry estimate: the model's error as it
is, next to tokens' and FLOPs' (each times its best single scale for those runs); factors fitted to the runs, judged two ways (random
5-fold held-out error with a Wilcoxon test, the check `costmodel correct` used first, and
the check over micro-batch sizes it uses now); and factors fitted to one set applied to
the other (does a correction carry over to other runs of the same GPU?): the profile's
from the validation's training runs on the ranks, the estimate's from the ranks on the
validation's training runs. Computed on the CPU from stored times: nothing is timed here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from scipy.stats import wilcoxon

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_scheduler import write_cases  # noqa: E402
from costmodel.calibration.correct import (  # noqa: E402
    Run,
    fit_correction,
    format_factors,
    part_times,
    validation_runs,
)
from costmodel.estimate import estimate_cost_model  # noqa: E402
from costmodel.model import PARTS, load_cost_model  # noqa: E402

PROFILE = "h200/qwen3-8b"
BENCH = ROOT / "benchmarks" / "results" / "bench_schedule_h200.json"
FOLDS = 5


def bench_schedule_runs(path: Path) -> list[Run]:
    """Each measured rank of a `bench-schedule` result as a run: one layer, no head."""
    doc = json.loads(path.read_text())
    return [Run(microbatches=tuple(tuple(mb) for mb in mbs), ms=float(ms), layers=1, head=False)
            for run in doc["runs"]
            for mbs, ms in zip(run["microbatch_lengths"], run["measured_rank_ms"])]


def error(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    rel = predicted / measured - 1
    return {"mape": float(np.abs(rel).mean()), "bias": float(rel.mean()),
            "worst": float(np.abs(rel).max())}


def random_folds(model, runs: list[Run], mode: str, parts: np.ndarray,
                 measured: np.ndarray) -> dict[str, float]:
    """Held-out error over random folds (each run predicted by factors fitted without it);
    ``parts``, ``measured``: the runs' `part_times` and times."""
    held = np.empty(len(runs))
    order = np.random.default_rng(0).permutation(len(runs))
    for rows in np.array_split(order, FOLDS):
        train = [runs[i] for i in np.setdiff1d(order, rows)]
        scales = fit_correction(model, train).figures[mode]["scales"]
        held[rows] = parts[rows] @ np.array([scales[p] for p in PARTS])
    before = np.abs(parts.sum(axis=1) / measured - 1)
    after = np.abs(held / measured - 1)
    return {**error(held, measured),
            "wilcoxon_p": float(wilcoxon(before, after, alternative="greater").pvalue)}


def judge(model, runs: list[Run], mode: str, name: str) -> dict:
    fig = fit_correction(model, runs, folds=FOLDS).figures[mode]
    parts, measured = part_times(model, runs), np.array([r.ms for r in runs])
    return {"model": "estimate" if model.is_estimate else "profile", "label": model.label,
            "runs": name, "mode": mode, "count": len(runs),
            "as_is": error(parts.sum(axis=1), measured),
            "factors": fig["scales"], "random_folds": random_folds(model, runs, mode, parts, measured),
            "size_folds": {**error_of(fig), "wilcoxon_p": fig["p_value"]},
            "adopted": fig["adopted"], "why_not": fig.get("why_not"),
            "tokens_best_scaled": fig["baselines"]["all"]["tokens"]["mape"],
            "flops_best_scaled": fig["baselines"]["all"]["flops"]["mape"]}


def carried(model, factors: dict, runs: list[Run], what: str) -> dict:
    """Factors fitted to one set of runs, judged on another (never used in the fit)."""
    parts, measured = part_times(model, runs), np.array([r.ms for r in runs])
    big = np.array([sum(map(sum, r.microbatches)) / len(r.microbatches) >= 1024 for r in runs])
    scaled, as_is = parts @ np.array([factors[p] for p in PARTS]), parts.sum(axis=1)
    return {"what": what, "runs": runs_name(runs), "factors": factors,
            "as_is": error(as_is, measured), "corrected": error(scaled, measured),
            "as_is_1k": error(as_is[big], measured[big])["mape"],
            "corrected_1k": error(scaled[big], measured[big])["mape"]}


def runs_name(runs: list[Run]) -> str:
    return ("bench-schedule ranks" if runs[0].layers == 1
            else f"validation ({runs[0].mode})")


def error_of(fig: dict) -> dict[str, float]:
    return {"mape": fig["held_out"]["mape"], "worst": fig["held_out"]["worst"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    model = load_cost_model(PROFILE)
    validation = validation_runs(model)
    ranks = bench_schedule_runs(BENCH)
    estimate = estimate_cost_model("qwen3-8b", "h200")
    rows = []
    for judged in (model, estimate):  # rows 0-2, 3-5
        rows += [judge(judged, [r for r in validation if r.mode == mode], mode, "validation")
                 for mode in ("train", "forward")]
        rows.append(judge(judged, ranks, "train", "bench-schedule"))
    train_validation = [r for r in validation if r.mode == "train"]
    transfer = [
        # what random folds would have adopted, carried to the other set of runs
        carried(model, rows[0]["factors"], ranks,
                "the profile, factors fitted to the validation (train)"),
        # what the size check adopted, carried to the other set of runs
        carried(estimate, rows[5]["factors"], train_validation,
                "the estimate, factors fitted to the bench-schedule ranks"),
    ]
    print(f"{PROFILE}: {model.label}; stored H200 times, folds {FOLDS}")
    print(f"  {'model':9} {'runs':15} {'pass':8} {'n':>4} {'as is':>8} {'tokens':>7} "
          f"{'flops':>7} {'random':>8} {'p':>7} {'by size':>8} {'p':>7}  adopted  factors")
    for r in rows:
        f = format_factors(r["factors"])
        print(f"  {r['model']:9} {r['runs']:15} {r['mode']:8} {r['count']:4d} "
              f"{r['as_is']['mape']:8.2%} "
              f"{r['tokens_best_scaled']:7.2%} {r['flops_best_scaled']:7.2%} "
              f"{r['random_folds']['mape']:8.2%} {r['random_folds']['wilcoxon_p']:7.2g} "
              f"{r['size_folds']['mape']:8.2%} {r['size_folds']['wilcoxon_p']:7.2g}  "
              f"{'yes' if r['adopted'] else 'no':7}  {f}")
    for t in transfer:
        print(f"  {t['what']}, on the {t['runs']}: error {t['as_is']['mape']:.2%} (bias "
              f"{t['as_is']['bias']:+.2%}) -> {t['corrected']['mape']:.2%} (bias "
              f"{t['corrected']['bias']:+.2%}); micro-batches of >= 1k tokens "
              f"{t['as_is_1k']:.2%} -> {t['corrected_1k']:.2%}")
    if args.json:
        write_cases(args.json, rows, transfer=transfer, cost_model=PROFILE, label=model.label,
                    note="stored H200 times (2026-11-30 session), computed on the CPU: nothing "
                         "timed here", folds=FOLDS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
