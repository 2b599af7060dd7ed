"""The FLOPs check: every measured point against analytic FLOPs and the GPU's peak.

For each point the matmul FLOPs it must have done come from `costmodel.flops`
(attention core per sequence, one layer's projections + MLP/MoE, the LM head), times 3
for a training pass (backward = 2 × forward; a flash-attention backward that recomputes
QKᵀ does more hardware work than that, so the check is conservative). Achieved FLOP/s
above the registry's peak by more than `tolerance` cannot happen: it means the timer
did not wait for the GPU, timed the wrong device, or the workload skipped work, so it is
an error. The result lists TFLOP/s and efficiency per length/token count for the report.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from costmodel import flops
from costmodel.calibration.fit import Record
from costmodel.spec import ModelSpec

__all__ = ["flops_check", "record_flops"]

DEFAULT_TOLERANCE = 0.05


def record_flops(r: Record, spec: ModelSpec) -> float:
    """Matmul FLOPs of one measured point (forward × 3 for train)."""
    passes = flops.pass_factor(r.mode)
    tokens = [r.tokens]
    if r.kind == "attention":
        work = flops.part_flops("attention", r.lengths, spec).sum()
    elif r.kind in ("linear", "head"):
        work = flops.part_flops(r.kind, tokens, spec, moe=r.moe)[0]
    elif r.kind == "layer":
        work = (flops.part_flops("attention", r.lengths, spec).sum()
                + flops.part_flops("linear", tokens, spec, moe=r.moe)[0])
    else:
        raise ValueError(f"no FLOPs count for point kind {r.kind!r}")
    return passes * float(work)


def flops_check(
    records: list[Record],
    spec: ModelSpec,
    *,
    peak_flops: float | None,
    gpu_name: str,
    tolerance: float = DEFAULT_TOLERANCE,
) -> dict[str, Any]:
    """TFLOP/s and efficiency of every point; ValueError if any beats the peak.

    With `peak_flops=None` (a GPU missing from the registry) TFLOP/s are reported and the
    peak check is skipped (the result says so).
    """
    if peak_flops is not None and (
        isinstance(peak_flops, bool) or not isinstance(peak_flops, (int, float))
        or not math.isfinite(peak_flops) or peak_flops <= 0
    ):
        raise ValueError(f"peak_flops must be a finite number > 0 (or None: no check), got "
                         f"{peak_flops!r}")  # 0 or NaN passed a 100x-too-fast point
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
    rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
    violations = []
    best = 0.0
    for r in records:
        work = record_flops(r, spec)
        achieved = work / (r.ms * 1e-3)
        eff = achieved / peak_flops if peak_flops else None
        key = f"{r.kind}{' moe' if r.moe else ''} {r.mode}"
        row = {"tokens": r.tokens, "ms": r.ms, "tflops": achieved / 1e12}
        if r.kind == "attention":
            row.update(length=int(r.lengths[0]), n=len(r.lengths))
        if eff is not None:
            row["efficiency"] = eff
            best = max(best, eff)
            if eff > 1.0 + tolerance:
                violations.append((eff, r, achieved))
        rows[key].append(row)
    if violations:
        assert peak_flops is not None  # only points checked against the peak are violations
        eff, r, achieved = max(violations, key=lambda v: v[0])
        what = (f"attention L={r.lengths[0]} n={len(r.lengths)}" if r.kind == "attention"
                else f"{r.kind} T={r.tokens}")
        raise ValueError(
            f"broken measurement: {len(violations)} point(s) run faster than {gpu_name} can; "
            f"worst {what} ({r.mode}) took {r.ms:.4g} ms = {achieved / 1e12:.4g} TFLOP/s, "
            f"{eff * 100:.4g}% of the {peak_flops / 1e12:.0f} TFLOP/s bf16 peak. The timer is not "
            "waiting for the GPU, the wrong device is timed, or the workload skips work"
        )
    for key in rows:
        rows[key].sort(key=lambda row: (row.get("length", row["tokens"]), row.get("n", 1)))
    return {
        "peak_tflops": peak_flops / 1e12 if peak_flops else None,
        "tolerance": tolerance,
        "checked": peak_flops is not None,
        "max_efficiency": best if peak_flops else None,
        "points": dict(rows),
        "note": None if peak_flops else f"{gpu_name} is not in the GPU registry: no peak to check against",
    }
