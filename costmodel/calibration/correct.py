"""Correct a cost model's parts from measured runs of the whole stack.

Calibration times each part of a micro-batch alone: attention per length, the token-linear
layer per token count, the fixed costs. A real stack runs them together, and what it pays
is not always their sum: in an eager PyTorch stack, each part timed alone pays launch and
autograd overheads that overlap when they run in one graph (on the first H200 profile the
parts summed to up to 73% more than a small micro-batch's stack); a training framework
adds its own per-token work (tensor-parallel collectives, recomputation); another attention
kernel than the calibrated one shifts the attention part. Such differences scale a part,
not one micro-batch.

A correction fits one factor per part (`costmodel.model.PARTS`: overhead, attention,
linear, head) and per pass to runs measured end to end — `validate`'s random micro-batches
stored in the file, or a training run's per-rank times — and scales the curves by them:
the file format, the scheduler and every caller stay as they are. One factor per part
scales every curve of that part: "overhead" both the per-layer and the per-micro-batch
fixed cost, "linear" the dense and the MoE layer's curve alike (runs of a stack tell only
its own layer's).

The fit: least squares of the relative error (what MAPE measures) over the runs, each
factor bounded (`_BOUNDS`), with a weak pull towards 1 (`_PRIOR_WEIGHT`) so that a part the
runs do not tell apart from the others keeps its calibrated scale. Judged by cross-validation
over micro-batch sizes (each size range predicted by factors fitted to the others,
`_judge`); a pass keeps its curves unless the held-out errors are smaller than the
uncorrected model's by more than chance and no size range is predicted notably worse. The
corrected curves must pass the FLOPs check against the GPU's peak, as measured ones do.

Runs: `costmodel.calibration.runs_file` (the file `costmodel correct --runs` reads).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import lsq_linear
from scipy.stats import wilcoxon

from costmodel import flops
from costmodel.beyond_peak import curves_beyond_peak
from costmodel.calibration.runs_file import Run, read_runs, run_line
from costmodel.calibration.validate import error_metrics, revalidate, stack_flops, summarize
from costmodel.curves import MODES
from costmodel.model import PARTS, CostModel
from costmodel.model_file import utc_timestamp

__all__ = [  # Run, read_runs, run_line: the runs file's (`runs_file`), here for the callers
    "Correction", "Run", "apply_correction", "check_folds", "fit_correction", "format_factors",
    "part_times", "read_runs", "run_line", "validation_runs",
]

logger = logging.getLogger(__name__)

MIN_RUNS = 10  # per pass: four factors from fewer runs fit their noise
DEFAULT_FOLDS = 5

# Overheads may vanish (their launches overlap in the stack); a curve scaled to nothing
# would price its part at 0. Past 20x the runs are not of this model and GPU.
_BOUNDS = {"overhead": (0.0, 20.0), "attention": (0.05, 20.0), "linear": (0.05, 20.0),
           "head": (0.05, 20.0)}
# Per factor, in units of one run's relative error, times sqrt(runs): on the H200
# validation runs (random 5-fold, train) 0.02 left the held-out error as without it, 6.0%,
# and 0.1 raised it to 8%; it only decides the factors of parts the runs cannot tell apart.
_PRIOR_WEIGHT = 0.02
_SIGNIFICANCE = 0.05
# A size range held out may come out this much worse (relative, and at least half a
# percentage point) before the correction is refused: noise, not a trade.
_RANGE_SLACK = 0.1


def check_folds(folds: int, name: str = "folds") -> None:
    """ValueError, naming `name` (the CLI's --folds), unless 2 <= folds <= 100."""
    if not 2 <= folds <= 100:
        raise ValueError(f"{name} must be in 2..100, got {folds}")


@dataclass
class Correction:
    """Factors per pass and part, and how well they predict runs they were not fitted to."""

    scales: dict[str, dict[str, float]]
    """Per corrected pass: factor per part (`PARTS`). A pass not here is unchanged."""
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per pass with runs: runs, folds, `before` / `held_out` / `in_sample` error metrics
    (`validate.error_metrics`), the same `by_size` (all runs, and those whose micro-batches
    hold >= 1k tokens on average), `baselines` (tokens and FLOPs, each best-scaled, in
    `validate`'s form), the fitted `scales`, the test's `p_value`, `adopted`,
    and why not where it is not."""


def validation_runs(model: CostModel) -> list[Run]:
    """The stacks `validate` measured and stored in the model's file, as runs; ValueError
    when it holds none."""
    block = model.extra.get("validation")
    if not block:
        raise ValueError(f"{model.label} holds no validation: run `costmodel validate` on its "
                         "GPU first, or give measured runs (--runs)")
    # revalidate reads the stored micro-batches back (or draws them again from the seed)
    judged = revalidate(model, block)
    if judged is None:
        raise ValueError(f"{model.label}: its validation's micro-batches cannot be read back "
                         "(see the warning above); validate again")
    layers, moe = int(block["num_layers"]), bool(block["moe_layers"])
    return [Run(microbatches=(tuple(p["lengths"]),), ms=float(p["measured_ms"]), mode=mode,
                layers=layers, moe=moe)
            for mode, res in judged["modes"].items() for p in res["points"]]


def part_times(model: CostModel, runs: Sequence[Run]) -> np.ndarray:
    """The model's prediction of each run, part by part: shape (runs, len(PARTS)), ms."""
    out = np.zeros((len(runs), len(PARTS)))
    whole = [i for i, r in enumerate(runs) if r.layers is None]
    for i, run in enumerate(runs):
        if run.layers is not None:
            for mb in run.microbatches:
                stack = model.stack_parts(mb, run.mode, num_layers=run.layers, moe=run.moe,
                                          head=run.head)
                out[i] += [stack[p] for p in PARTS]
    for mode in {runs[i].mode for i in whole}:  # whole-model runs: vectorised, per pass
        rows = [i for i in whole if runs[i].mode == mode]
        mbs = [mb for i in rows for mb in runs[i].microbatches]
        offsets = np.cumsum([0] + [len(mb) for mb in mbs])
        parts = model.microbatch_parts(np.concatenate(mbs), offsets, mode)
        starts = np.cumsum([0] + [len(runs[i].microbatches) for i in rows])[:-1]
        for k, p in enumerate(PARTS):
            out[rows, k] = np.add.reduceat(parts[p], starts)
    return out


def _fit_scales(parts: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """Factors minimising the relative error of parts @ factors, pulled weakly towards 1."""
    n, k = parts.shape
    pull = _PRIOR_WEIGHT * math.sqrt(n)
    a = np.vstack([parts / measured[:, None], pull * np.eye(k)])
    b = np.concatenate([np.ones(n), np.full(k, pull)])
    lower, upper = zip(*(_BOUNDS[p] for p in PARTS))
    return lsq_linear(a, b, bounds=(lower, upper)).x


def fit_correction(model: CostModel, runs: Iterable[Run], *,
                   folds: int = DEFAULT_FOLDS) -> Correction:
    """Fit factors per pass to `runs` and judge them (see the module docstring);
    ValueError for a pass the model lacks, or with fewer than `MIN_RUNS` runs."""
    runs = list(runs)
    if not runs:
        raise ValueError("no runs to fit a correction to")
    check_folds(folds)
    correction = Correction(scales={})
    for mode in [m for m in MODES if any(r.mode == m for r in runs)]:
        mine = [r for r in runs if r.mode == mode]
        if mode not in model.modes:
            raise ValueError(f"{len(mine)} runs are {mode} passes, which {model.label} has no "
                             f"curves for (it has {model.modes})")
        if len(mine) < MIN_RUNS:
            raise ValueError(f"{len(mine)} {mode} run(s): a correction needs at least "
                             f"{MIN_RUNS} per pass; measure more")
        measured = np.array([r.ms for r in mine])
        tokens = np.array([sum(map(sum, r.microbatches)) for r in mine], dtype=np.float64)
        sizes = tokens / [len(r.microbatches) for r in mine]  # a run's mean micro-batch
        figures = _judge(part_times(model, mine), measured, sizes, min(folds, len(mine)))
        # The yardsticks `validate` sets beside a cost model: tokens and analytic FLOPs,
        # each times its best single scale for these runs.
        figures["baselines"] = summarize(
            measured, {"tokens": tokens, "flops": _runs_flops(model, mine)}, sizes)
        if figures["adopted"]:
            correction.scales[mode] = figures["scales"]
        correction.figures[mode] = figures
    return correction


def _judge(parts: np.ndarray, measured: np.ndarray, sizes: np.ndarray, folds: int) -> dict[str, Any]:
    """One pass's factors, fitted to all its runs, and whether to adopt them.

    Held out: the runs sorted by micro-batch size and cut into `folds` ranges, each range
    predicted by factors fitted to the others: the extrapolation a scheduler makes when
    it packs other micro-batches than the runs had. (Random folds were not enough: on the
    first H200 profile's validation they passed factors fitted to the launch-bound small
    micro-batches that priced the large ones of a separate H200 measurement 30% too low.)
    Adopted when the held-out errors are smaller than the uncorrected model's by more
    than chance (a one-sided Wilcoxon signed-rank test: on runs the model predicts up to
    noise, a bare "lower mean" adopted a third of the fits) and no size range is predicted
    notably worse.
    """
    order = np.argsort(sizes, kind="stable")
    ranges = np.array_split(order, folds)
    held_out = np.empty(len(measured))
    for rows in ranges:
        others = np.setdiff1d(order, rows)
        held_out[rows] = parts[rows] @ _fit_scales(parts[others], measured[others])
    scales = _fit_scales(parts, measured)
    predicted = parts.sum(axis=1)  # the model as it is
    error_before = np.abs(predicted / measured - 1)
    error_after = np.abs(held_out / measured - 1)
    # Identical errors (runs the model predicts exactly, say) leave the test nothing to rank:
    # scipy answers NaN with a warning, and NaN is no JSON for the file.
    p_value = (float(wilcoxon(error_before, error_after, alternative="greater").pvalue)
               if np.any(error_before != error_after) else 1.0)
    by_range: list[dict[str, Any]] = [
        {"tokens": [float(sizes[rows].min()), float(sizes[rows].max())], "runs": len(rows),
         "before": float(error_before[rows].mean()), "held_out": float(error_after[rows].mean())}
        for rows in ranges
    ]
    figures: dict[str, Any] = {
        "runs": len(measured), "folds": folds,
        "before": error_metrics(predicted, measured),
        "held_out": error_metrics(held_out, measured),
        "in_sample": error_metrics(parts @ scales, measured),
        "scales": dict(zip(PARTS, map(float, scales))), "p_value": p_value,
        "ranges": by_range,
        # all runs, and those of micro-batches of 1k tokens or more, as validate splits
        "by_size": summarize(measured, {"before": predicted, "held_out": held_out},
                             sizes, rescale=()),
    }
    worse = [r for r in by_range
             if r["held_out"] > max(r["before"] * (1 + _RANGE_SLACK), r["before"] + 0.005)]
    why = []
    if error_after.mean() >= error_before.mean() or p_value >= _SIGNIFICANCE:
        why.append(f"held-out error {error_after.mean():.2%} against the uncorrected "
                   f"{error_before.mean():.2%} is no better than chance (Wilcoxon p = "
                   f"{p_value:.2g})")
    if worse:
        # (a range predicted exactly before, error 0, is the worst)
        r = max(worse, key=lambda r: r["held_out"] / r["before"] if r["before"] else math.inf)
        why.append(f"fitted to the other sizes, it predicts micro-batches of "
                   f"{r['tokens'][0]:.0f}-{r['tokens'][1]:.0f} tokens worse ({r['held_out']:.2%} "
                   f"against {r['before']:.2%} uncorrected)")
    if why:
        figures["why_not"] = "; ".join(why) + ": curves kept"
    figures["adopted"] = "why_not" not in figures
    # (overhead's bound 0 is no warning: launches that overlap in the stack cost nothing)
    at_bound = [p for p, s in zip(PARTS, scales)
                if s >= _BOUNDS[p][1] * (1 - 1e-6) or s <= _BOUNDS[p][0] * (1 + 1e-6) > 0]
    if at_bound:
        logger.warning("the %s part(s) hit the bound of the correction (%s): the runs and the "
                       "model disagree more than a correction should fix; check that the runs "
                       "are of this model and GPU, or calibrate again", ", ".join(at_bound),
                       format_factors(figures["scales"]))
    return figures


def _runs_flops(model: CostModel, runs: Sequence[Run]) -> np.ndarray:
    """Forward matmul FLOPs of what each run ran: the whole model, or its stack."""
    spec = model.rank_spec
    out = np.zeros(len(runs))
    whole = [i for i, r in enumerate(runs) if r.layers is None]
    if whole:  # one call over every sequence of every whole-model run (a training log's
        # 100k micro-batches one call each took seconds)
        lengths = [L for i in whole for mb in runs[i].microbatches for L in mb]
        per_run = [sum(map(len, runs[i].microbatches)) for i in whole]
        starts = np.cumsum([0] + per_run)[:-1]
        out[whole] = np.add.reduceat(flops.sequence_fwd_flops(lengths, spec), starts)
    head = flops.lm_head_flops_per_token(spec)
    for i, run in enumerate(runs):
        if run.layers is not None:
            out[i] = sum(stack_flops(mb, spec, num_layers=run.layers, moe=run.moe)
                         - (0 if run.head else head * sum(mb)) for mb in run.microbatches)
    return out


def format_factors(scales: Mapping[str, Any]) -> str:
    """Factors per part as `correct`, `report` and the warnings show them."""
    return ", ".join(f"{p} x{float(s):.3g}" for p, s in scales.items())


def _scaled(block: Mapping[str, Any], scales: Mapping[str, float]) -> dict[str, Any]:
    """One pass's curves (the file's form) with each part scaled."""
    out = json.loads(json.dumps(block))  # a deep copy of plain JSON
    for key in ("per_layer_ms", "per_microbatch_ms"):
        out["overhead"][key] *= scales["overhead"]
    out["attention"]["ms"] = [y * scales["attention"] for y in out["attention"]["ms"]]
    for curve in out["linear"].values():
        curve["ms"] = [y * scales["linear"] for y in curve["ms"]]
    out["head"]["ms"] = [y * scales["head"] for y in out["head"]["ms"]]
    return out


def apply_correction(model: CostModel, correction: Correction, *, source: str,
                     command: str | None = None) -> CostModel:
    """`model` with its curves scaled by `correction`; its provenance records the factors
    (compounded with any earlier correction's) and figures, and a stored validation is
    judged again by the corrected curves. ValueError if a corrected curve beats the GPU's
    peak."""
    doc = model.to_dict()
    for mode, scales in correction.scales.items():
        doc["curves"][mode] = _scaled(doc["curves"][mode], scales)
    provenance = dict(doc.get("provenance") or {})
    total = _earlier_scales(provenance.get("correction"), model.label)
    for mode, scales in correction.scales.items():
        base = total.get(mode, dict.fromkeys(PARTS, 1.0))
        total[mode] = {p: float(base.get(p, 1.0)) * s for p, s in scales.items()}
    provenance["correction"] = {"from": source, "at": utc_timestamp(), "command": command,
                                "scales": total, "figures": correction.figures}
    doc["provenance"] = provenance
    corrected = CostModel.from_dict(doc, source=f"{model.label}, corrected")
    impossible = curves_beyond_peak(corrected)
    if impossible:
        own = curves_beyond_peak(model)
        if own:  # the file's own curves (hand-edited?): no fault of the runs
            raise ValueError(f"{model.label}: its own curves are impossible, before any "
                             f"correction ({own}): recalibrate it, or restore the file")
        raise ValueError(f"the corrected curves are impossible ({impossible}); the runs are "
                         f"not of {model.label}: measure them on that GPU and model")
    if doc.get("validation") and correction.scales:
        block = revalidate(corrected, doc["validation"])
        if block is not None:
            block["revalidated"] = {
                "at": utc_timestamp(), "by": "corrected",
                "note": "measured times from the validation run; predictions of the corrected "
                        "curves, whose factors may have been fitted to these runs (their "
                        "held-out error is in provenance.correction)"}
        corrected.extra["validation"] = block
    return corrected


def _earlier_scales(block: Any, label: str) -> dict[str, dict[str, float]]:
    """The factors of the corrections `block` (provenance.correction) records, to compound
    with a new one's; ValueError if they are not factors per pass and part."""
    if not block:
        return {}
    try:
        scales = block.get("scales") or {}
        if not isinstance(scales, Mapping):
            raise TypeError
        total = {str(mode): {str(p): float(f) for p, f in factors.items()}
                 for mode, factors in scales.items()}
        if not all(math.isfinite(f) and f >= 0 for factors in total.values()
                   for f in factors.values()):
            raise TypeError
    except (AttributeError, TypeError, ValueError):
        raise ValueError(f"{label}: its provenance.correction is malformed (scales must be "
                         "factors per pass and part, as `costmodel correct` writes them): "
                         "restore the file, or correct the uncorrected one") from None
    return total
