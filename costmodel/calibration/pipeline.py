"""`calibrate()`: sweep -> fit -> FLOPs check -> CostModel. One code path for every timer.

The GPU run passes a `KernelTimer` (costmodel.calibration.workloads), tests a
`SyntheticTimer`; nothing else differs. The drift probe (the same micro-batch timed
before and after the sweep) warns when the two differ by more than 5% (clocks throttling,
another process on the GPU), and is recorded in the file. Past the plan's deadline the
sweep skips the refinement points it has not reached (see costmodel.calibration.plan).
Before the deadline, and within RETAKE_SHARE more of its time, it measures again the
whole-layer probes and the token-curve points its monotone fit disagrees with
(costmodel.calibration.retake).

Measurements outlive failures: if the sweep is interrupted or the fit or the FLOPs check
fails, `save_partial` receives a "partial" document with every point measured so far, and
`refit(doc)` fits a cost model again from the measurements of a partial or complete file
(on any machine: no GPU needed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from costmodel.calibration.check import flops_check
from costmodel.calibration.fit import Record, check_time, fit_mode, residuals
from costmodel.calibration.plan import SweepPlan, SweepPoint
from costmodel.calibration.retake import (
    RETAKE_OFF,
    RETAKE_SHARE,
    points_to_retake,
    scatter_between_measurements,
)
from costmodel.calibration.timer import Timer
from costmodel.checks import positive_int
from costmodel.curves import MODES
from costmodel.gpus import GpuInfo, lookup_gpu
from costmodel.model import CostModel
from costmodel.model_file import SCHEMA, utc_timestamp
from costmodel.spec import ModelSpec

__all__ = ["DRIFT_WARNING", "PARTIAL_SCHEMA", "Progress", "calibrate", "fit_measurements", "refit"]

logger = logging.getLogger(__name__)

DRIFT_WARNING = 0.05
PARTIAL_SCHEMA = "costmodel-partial/1"
_SWEEP_KEYS = ("plan", "sweep_seconds", "skipped_points", "retaken", "drift_probe")

class Progress(Protocol):
    """Called after each point: done of total, the point, seconds since the pass began;
    ``again`` for the points measured again after the sweep (a pass of its own)."""

    def __call__(self, done: int, total: int, point: SweepPoint, elapsed_s: float, *,
                 again: bool = False) -> None: ...


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
    save_partial: Callable[[dict[str, Any]], None] | None = None,
    tensor_parallel: int = 1,
    expert_tensor_parallel: int | None = None,
) -> CostModel:
    """Run `plan` with `timer` and return the fitted, checked cost model (not yet saved).

    With `tensor_parallel` > 1 (or `expert_tensor_parallel`), `timer` and `plan` time one
    rank's shard of `spec` (`ModelSpec.shard`), and the model records `spec` and the sizes.

    The timer's `timing` ("graph" or "eager", see costmodel.calibration.timer) is recorded
    with the kernels, so that `validate` times micro-batches the same way. If anything fails after
    the first measurement (an error, Ctrl-C, a timeout's SIGINT), `save_partial` is called
    with the partial document before the exception propagates.
    """
    fingerprint = timer.device_fingerprint()
    kernels = {"attention": attention, "linear": "costmodel.kernels.layer (attention='none')",
               "head": "costmodel.kernels.layer.LMHead", "dtype": dtype, "timing": timer.timing}
    logger.info("calibrating %s on %s: %s", spec.name, fingerprint.get("name"), plan.summary())
    records: list[Record] = []
    sweep: dict[str, Any] = {"plan": plan.to_dict()}
    try:
        _run_sweep(timer, plan, records, sweep, progress)
        return fit_measurements(spec, records, device=fingerprint, sweep=sweep, gpu_key=gpu_key,
                                gpu_info=gpu_info, kernels=kernels, command=command,
                                tensor_parallel=tensor_parallel,
                                expert_tensor_parallel=expert_tensor_parallel)
    except BaseException as err:
        if save_partial is not None and records:
            save_partial({
                "schema": PARTIAL_SCHEMA,
                "created": utc_timestamp(),
                "command": command,
                "error": f"{type(err).__name__}: {err}",
                "gpu": {"key": gpu_key, "name": fingerprint.get("name")},
                "device": fingerprint,
                "spec": spec.to_dict(),
                "tensor_parallel": tensor_parallel,
                "expert_tensor_parallel": expert_tensor_parallel,
                "kernels": kernels,
                "sweep": sweep,
                "measurements": [r.to_dict() for r in records],
            })
        raise


def _measure(timer: Timer, point, settings, what: str):
    """``timer``'s measurement of ``point``, checked: a broken timer (0, negative or NaN ms)
    would fit a curve silently, or divide by zero in the drift probe."""
    m = timer.measure(point, repeats=settings.repeats, warmup=settings.warmup)
    try:
        check_time(m.median_ms, m.spread)
    except ValueError as err:
        raise ValueError(f"{what} for {point.kind} {point.mode} of "
                         f"{point.tokens} tokens is impossible: {err}") from None
    return m


def _record(timer: Timer, point: SweepPoint, settings) -> Record:
    m = _measure(timer, point, settings, "the timer's result")
    return Record(point.kind, point.mode, point.lengths, m.median_ms, m.spread, point.moe)


def _retake(timer: Timer, plan: SweepPlan, records: list[Record], progress: Progress | None,
            sweep: dict[str, Any], *, until: float) -> None:
    """Measure the points `points_to_retake` names ``plan.settings.retakes`` more times,
    round by round (each point's measurements at different moments), until ``until``
    (perf_counter seconds); their records join ``records`` (the fit takes each token
    count's median). What was done goes to ``sweep["retaken"]``, for the file, after each
    measurement: a partial file saved mid-pass says how many of its measurements are
    retakes (it said nothing, and read as that many more sweep points)."""
    rounds = plan.settings.retakes
    chosen = points_to_retake(plan.points, records) if rounds > 0 else []
    queue = [i for _ in range(rounds) for i in chosen]
    start, done = time.perf_counter(), 0
    # Each point's times that were not chosen for being off: every retake, and a probe's
    # first measurement too (all probes are measured again).
    unchosen: dict[int, list[float]] = {
        i: [records[i].ms] if plan.points[i].kind == "layer" else [] for i in chosen}
    retaken = sweep["retaken"] = {"rounds": rounds, "points": len(chosen), "measurements": 0,
                                  "off_by_more_than": RETAKE_OFF, "seconds": 0.0}
    if chosen:
        logger.info("measuring %d points again (%d rounds): off their curve's monotone fit by "
                    "more than %.0f%%", len(chosen), rounds, 100 * RETAKE_OFF)
    for i in queue:
        if time.perf_counter() >= until:
            if progress is not None and done:  # ends the progress line at the last point measured
                progress(done, done, plan.points[queue[done - 1]], time.perf_counter() - start,
                         again=True)
            break
        records.append(_record(timer, plan.points[i], plan.settings))
        unchosen[i].append(records[-1].ms)
        done += 1
        retaken.update(measurements=done, seconds=round(time.perf_counter() - start, 2),
                       **scatter_between_measurements(list(unchosen.values())))
        if progress is not None:
            progress(done, len(queue), plan.points[i], time.perf_counter() - start, again=True)
    if done < len(queue):
        logger.info("measured %d of %d retakes before the time limit", done, len(queue))
    retaken["seconds"] = round(time.perf_counter() - start, 2)


def _run_sweep(timer: Timer, plan: SweepPlan, records: list[Record], sweep: dict[str, Any],
               progress: Progress | None) -> None:
    """Measure the drift probe, the plan's points (up to its deadline), the probe again."""
    s = plan.settings
    t0 = time.perf_counter()
    start = _measure(timer, plan.probe, s, "the drift probe's timer result")
    sweep["drift_probe"] = {"point": plan.probe.to_dict(), "start_ms": start.median_ms}
    total, skipped = len(plan.points), 0
    for i, point in enumerate(plan.points):
        elapsed = time.perf_counter() - t0
        if i >= plan.essential and elapsed > plan.deadline_s:
            skipped = total - i
            logger.warning(
                "sweep at %.0f s, past its deadline of %.0f s (plan estimate %.0f s): skipping "
                "the last %d of %d points (refinements; every curve keeps its coarse grid)",
                elapsed, plan.deadline_s, plan.estimated_s, skipped, total,
            )
            if progress is not None:
                progress(i, i, plan.points[i - 1], elapsed)  # ends the progress line
            break
        records.append(_record(timer, point, s))
        if progress is not None:
            progress(i + 1, total, point, time.perf_counter() - t0)
    swept = time.perf_counter() - t0
    until = t0 + min(plan.deadline_s, (1 + RETAKE_SHARE) * swept)
    sweep["skipped_points"] = skipped  # for a partial file saved while measuring again
    _retake(timer, plan, records, progress, sweep, until=until)
    end = _measure(timer, plan.probe, s, "the drift probe's timer result")
    sweep_s = time.perf_counter() - t0
    drift = end.median_ms / start.median_ms - 1.0
    if abs(drift) > DRIFT_WARNING:
        logger.warning(
            "drift probe (%s) moved %+.1f%% between the start and the end of the sweep "
            "(%.4g -> %.4g ms): clocks throttled or the GPU was shared; the curves may be off",
            plan.probe.describe(), 100 * drift, start.median_ms, end.median_ms,
        )
    again = sweep["retaken"]  # the plan's estimate is of the sweep alone
    logger.info("sweep: %d points in %.1f s (plan estimate %.1f s), %d measured again in %.1f s",
                len(records) - again["measurements"], sweep_s - again["seconds"],
                plan.estimated_s, again["measurements"], again["seconds"])
    sweep["drift_probe"].update(end_ms=end.median_ms, relative_change=drift,
                                warning=abs(drift) > DRIFT_WARNING)
    sweep.update(sweep_seconds=round(sweep_s, 2), skipped_points=skipped)


def fit_measurements(
    spec: ModelSpec,
    records: list[Record],
    *,
    device: Mapping[str, Any],
    sweep: Mapping[str, Any],
    gpu_key: str,
    gpu_info: GpuInfo | None,
    kernels: Mapping[str, Any],
    command: str | None,
    created: str | None = None,
    tensor_parallel: int = 1,
    expert_tensor_parallel: int | None = None,
) -> CostModel:
    """Fit every mode that has measurements, check them against FLOPs, build the model.
    The measurements are of one rank's shard of `spec` (`ModelSpec.shard`).

    A mode whose fit fails (an interrupted sweep never reached it) is dropped with a
    warning as long as another mode fits; if none does, the first error is raised.
    """
    needs = spec.linear_kinds
    curves, fit_details, resid, errors = {}, {}, {}, {}
    planned = (sweep.get("plan") or {}).get("modes") or []
    if isinstance(planned, str) or not isinstance(planned, (list, tuple)):
        planned = []  # a hand-edited record ("train" would be read letter by letter)
    for mode in dict.fromkeys([*(m for m in planned if m in MODES), *(r.mode for r in records)]):
        try:
            curves[mode], fit_details[mode] = fit_mode(records, mode, needs=needs)
        except ValueError as err:
            errors[mode] = str(err)
            continue
        call_ms = fit_details[mode]["attention"]["call_ms"]
        resid[mode] = residuals(curves[mode], [r for r in records if r.mode == mode], call_ms)
    if not curves:
        raise ValueError(f"cannot fit any mode from {len(records)} measurements: "
                         + "; ".join(f"{m}: {e}" for m, e in errors.items()))
    for mode, why in errors.items():
        logger.warning("mode %s dropped from the cost model: %s", mode, why)

    peak = gpu_info.peak_bf16_flops if gpu_info is not None else None
    rank = spec.shard(tensor_parallel, expert_tensor_parallel)  # one GPU's work
    check = flops_check(records, rank, peak_flops=peak, gpu_name=str(device.get("name")))

    provenance: dict[str, Any] = {
        "kind": "measured",
        "note": f"measured with `costmodel calibrate` on {device.get('name')}",
        **{k: sweep[k] for k in _SWEEP_KEYS if k in sweep},
        "fit": fit_details,
        "dropped_modes": errors or None,
        "gpu_source": gpu_info.source if gpu_info is not None else None,
    }
    if device.get("synthetic"):
        provenance["kind"] = "synthetic"
        provenance["note"] = "synthetic timer (tests): not a measurement of any GPU"
    elif device.get("dry_run"):
        provenance["kind"] = "dry-run"
        provenance["note"] = "CPU dry run of the GPU workloads: not a measurement of any GPU"
    return CostModel(
        spec=spec,
        gpu=str(device.get("name")),
        gpu_key=gpu_key,
        curves=curves,
        is_estimate=False,
        provenance=provenance,
        extra={
            "created": created or utc_timestamp(),
            "command": command,
            "device": dict(device),
            "kernels": dict(kernels),
            "measurements": [r.to_dict() for r in records],
            "residuals": resid,
            "flops_check": check,
            "validation": None,
        },
        tensor_parallel=tensor_parallel,
        expert_tensor_parallel=expert_tensor_parallel,
    )


def refit(doc: Mapping[str, Any], *, source: str, command: str | None = None) -> CostModel:
    """A cost model fitted again from the measurements stored in a calibrated file or in a
    partial one (`PARTIAL_SCHEMA`); ValueError if it holds none."""
    schema = doc.get("schema") if isinstance(doc, Mapping) else None
    if schema not in (SCHEMA, PARTIAL_SCHEMA):
        raise ValueError(f"{source}: cannot refit: unsupported schema {schema!r}; this version "
                         f"reads {SCHEMA!r} and {PARTIAL_SCHEMA!r} files")
    try:
        spec = ModelSpec.from_dict(doc["spec"])
        tensor_parallel = positive_int(doc.get("tensor_parallel", 1), "tensor_parallel")
        expert_tp = doc.get("expert_tensor_parallel")
        expert_tp = None if expert_tp is None else positive_int(expert_tp, "expert_tensor_parallel")
        spec.shard(tensor_parallel, expert_tp)  # sizes the spec does not split by: refused here
        measurements = list(doc["measurements"])
        gpu_key, gpu_name = doc["gpu"]["key"], doc["gpu"].get("name")
        if not isinstance(gpu_key, str) or not gpu_key.strip():  # null was written as "None"
            raise ValueError(f"gpu.key must be a registry key such as 'h200', got {gpu_key!r:.40}")
        device = dict(doc["device"])
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"{source}: cannot refit: it needs 'spec', 'gpu', 'device' and 'measurements' as "
            f"written by `costmodel calibrate` ({type(err).__name__}: {err})"
        ) from None
    records = []
    for i, d in enumerate(measurements):
        try:
            records.append(Record.from_dict(d))
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            raise ValueError(
                f"{source}: cannot refit: measurement {i} is invalid ({type(err).__name__}: "
                f"{err}); remove it or measure again with `costmodel calibrate`"
            ) from None
    if not records:
        raise ValueError(f"{source}: cannot refit: it holds no measurements")
    provenance = doc.get("provenance") or {}
    sweep = doc.get("sweep") or (
        {k: provenance[k] for k in _SWEEP_KEYS if k in provenance}
        if isinstance(provenance, Mapping) else {}
    )
    # What fit_measurements reads of the sweep: the plan and the drift probe, as objects.
    bad = (["sweep"] if not isinstance(sweep, Mapping) else
           [k for k in ("plan", "drift_probe") if not isinstance(sweep.get(k) or {}, Mapping)])
    if bad:
        raise ValueError(f"{source}: cannot refit: its sweep record ({', '.join(bad)}) is not "
                         "an object as `costmodel calibrate` writes it")
    kernels = doc.get("kernels") or {}
    # dict() of anything else: a TypeError (a number) or a "dictionary update sequence" error
    if not isinstance(kernels, Mapping):
        raise ValueError(f"{source}: cannot refit: its 'kernels' ({kernels!r:.40}) is not an "
                         "object as `costmodel calibrate` writes it (attention, linear, head, "
                         "dtype)")
    try:
        info = lookup_gpu(gpu_key)
    except ValueError:
        info = None  # as a calibration on a GPU outside the registry: the check is noted
        logger.warning("%s: GPU key %r is not in the registry: no peak FLOP/s to check the "
                       "measurements against", source, gpu_key)
    device.setdefault("name", gpu_name)
    model = fit_measurements(
        spec, records, device=device, sweep=sweep, gpu_key=gpu_key, gpu_info=info,
        kernels=kernels, command=doc.get("command"), created=doc.get("created"),
        tensor_parallel=tensor_parallel, expert_tensor_parallel=expert_tp,
    )
    if isinstance(provenance, Mapping) and provenance.get("correction"):
        logger.warning("%s: its curves were corrected (`costmodel correct`); the refit fits the "
                       "measurements alone, without the correction: run `costmodel correct` on "
                       "the refitted file again", source)
    model.provenance["refit"] = {"from": source, "at": utc_timestamp(), "command": command,
                                 "partial_error": doc.get("error")}
    if doc.get("validation"):
        # The GPU's validation times hold for any fit of the same sweep; judge them again
        # with the new curves rather than drop them (a refit then needs no GPU to say how
        # good it is).
        from costmodel.calibration.validate import revalidate

        block = revalidate(model, doc["validation"])
        if block is not None:
            block["revalidated"] = {"at": utc_timestamp(), "note": "measured times from the "
                                    "validation run; predictions from the refitted curves"}
            model.extra["validation"] = block
    return model
