"""`calibrate()`: sweep -> fit -> FLOPs check -> CostModel. One code path for every timer.

The GPU run passes a `CudaTimer` (costmodel.calibration.workloads), tests a
`SyntheticTimer`; nothing else differs. The drift probe (the same micro-batch timed
before and after the sweep) warns when the two differ by more than 5% (clocks throttling,
another process on the GPU), and is recorded in the file.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from costmodel.calibration.check import flops_check
from costmodel.calibration.fit import Record, fit_mode, residuals
from costmodel.calibration.plan import SweepPlan, SweepPoint
from costmodel.calibration.timer import Timer
from costmodel.gpus import GpuInfo
from costmodel.model import CostModel, _now
from costmodel.spec import ModelSpec

__all__ = ["DRIFT_WARNING", "Progress", "calibrate"]

logger = logging.getLogger(__name__)

DRIFT_WARNING = 0.05

Progress = Callable[[int, int, SweepPoint, float], None]
"""progress(done, total, point, elapsed_s), called after each point."""


def calibrate(
    spec: ModelSpec,
    *,
    timer: Timer,
    plan: SweepPlan,
    gpu_key: str,
    gpu_info: GpuInfo | None,
    attention: str,
    dtype: str = "bf16",
    command: str | None = None,
    progress: Progress | None = None,
) -> CostModel:
    """Run `plan` with `timer` and return the fitted, checked cost model (not yet saved)."""
    s = plan.settings
    fingerprint = timer.device_fingerprint()
    modes = tuple(dict.fromkeys(p.mode for p in plan.points))
    logger.info("calibrating %s on %s: %s", spec.name, fingerprint.get("name"), plan.summary())
    t0 = time.perf_counter()
    start = timer.measure(plan.probe, repeats=s.repeats, warmup=s.warmup)
    records: list[Record] = []
    for i, point in enumerate(plan.points):
        m = timer.measure(point, repeats=s.repeats, warmup=s.warmup)
        records.append(Record(point.kind, point.mode, point.lengths, m.median_ms, m.spread, point.moe))
        if progress is not None:
            progress(i + 1, len(plan.points), point, time.perf_counter() - t0)
    end = timer.measure(plan.probe, repeats=s.repeats, warmup=s.warmup)
    sweep_s = time.perf_counter() - t0
    drift = end.median_ms / start.median_ms - 1.0
    if abs(drift) > DRIFT_WARNING:
        logger.warning(
            "drift probe (%s) moved %+.1f%% between the start and the end of the sweep "
            "(%.4g -> %.4g ms): clocks throttled or the GPU was shared; the curves may be off",
            plan.probe.describe(), 100 * drift, start.median_ms, end.median_ms,
        )

    needs = tuple(k for k, n in (("dense", spec.num_dense_layers), ("moe", spec.num_moe_layers)) if n)
    curves, fit_details, resid = {}, {}, {}
    for mode in modes:
        curves[mode], fit_details[mode] = fit_mode(records, mode, needs=needs)
        call_ms = fit_details[mode]["attention"]["call_ms"]
        resid[mode] = residuals(curves[mode], [r for r in records if r.mode == mode], call_ms)

    peak = gpu_info.peak_bf16_flops if gpu_info is not None else None
    check = flops_check(records, spec, peak_flops=peak, gpu_name=str(fingerprint.get("name")))

    provenance: dict[str, Any] = {
        "kind": "measured",
        "note": f"measured with `costmodel calibrate` on {fingerprint.get('name')}",
        "plan": plan.to_dict(),
        "sweep_seconds": round(sweep_s, 2),
        "drift_probe": {
            "point": plan.probe.to_dict(),
            "start_ms": start.median_ms,
            "end_ms": end.median_ms,
            "relative_change": drift,
            "warning": abs(drift) > DRIFT_WARNING,
        },
        "fit": fit_details,
        "gpu_source": gpu_info.source if gpu_info is not None else None,
    }
    if fingerprint.get("synthetic"):
        provenance["kind"] = "synthetic"
        provenance["note"] = "synthetic timer (tests): not a measurement of any GPU"
    return CostModel(
        spec=spec,
        gpu=str(fingerprint.get("name")),
        gpu_key=gpu_key,
        curves=curves,
        is_estimate=False,
        provenance=provenance,
        extra={
            "created": _now(),
            "command": command,
            "device": fingerprint,
            "kernels": {"attention": attention, "linear": "costmodel.kernels.layer (attention='none')",
                        "head": "costmodel.kernels.layer.LMHead", "dtype": dtype},
            "measurements": [r.to_dict() for r in records],
            "residuals": resid,
            "flops_check": check,
            "validation": None,
        },
    )
