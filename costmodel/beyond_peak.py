"""Curves no GPU can run: a cost model's knots against its GPU's peak FLOP/s.

`calibrate` checks every measured point against the registry's peak
(`calibration.check.flops_check`); this checks what a file carries, its fitted curves, so
that a file whose numbers were edited or corrupted into ones no GPU reaches is refused on
load (a train attention curve of 1e-9 ms loaded and the scheduler balanced as if attention
were free) and a correction that would write one is refused (`costmodel correct`).

Matmul FLOPs come from `costmodel.flops` as in the calibration check (one sequence's
attention core, one layer's token-linear part, the LM head; x3 for training). Judged are
the knots whose work would take at least `JUDGED_MS` at the peak, and each curve's largest:
not the short lengths, whose per-sequence attention is what a pack's time leaves after the
per-call cost and may fit down to the fit's floor of 10 ns (`calibration.fit`; 10x the
H200's peak at L=64: a split of the time, not a speed). Where a knot's work takes 0.1 ms
at the peak the per-call cost (microseconds graph-timed, 0.05-0.14 ms eager on the H200)
is a small part of a pack's time. The tolerance is wider than calibration's for the same
reason: taking the per-call cost out of a pack can raise a per-sequence rate above the
pack's. Not checked: fixed costs (no FLOPs) and GPUs the registry lacks (no peak).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from costmodel import flops, gpus

if TYPE_CHECKING:
    from costmodel.model import CostModel

__all__ = ["JUDGED_MS", "TOLERANCE", "curves_beyond_peak"]

# How far past the datasheet peak a knot may run before it is impossible: calibration's 5%
# (boost clocks, a fit's smoothing) and room for the per-call cost taken out of a pack (up
# to 15% of its time, `calibration.fit`). The shipped H200 profile peaks at 61%.
TOLERANCE = 0.25
# Knots whose work takes at least this long at the peak are judged (and each curve's
# largest): the H200 profile's train attention from L = 2,048, its linear part from 86
# tokens.
JUDGED_MS = 0.1


class _Knot(NamedTuple):
    efficiency: float
    what: str
    ms: float


def curves_beyond_peak(model: CostModel) -> str | None:
    """What in ``model``'s curves runs faster than its GPU can (the fastest judged knot, as
    a multiple of the peak, and how many), or None when nothing does or no peak is known."""
    info = gpus.registry_entry(model.gpu_key, model.gpu)
    if info is None:
        return None
    spec = model.rank_spec
    too_fast: list[_Knot] = []
    for mode in model.modes:
        c = model.curves[mode]
        ms_per_flop = flops.pass_factor(mode) * 1e3 / info.peak_bf16_flops  # at the peak
        curves = [("attention", "attention", False, c.attention.lengths, c.attention.ms),
                  *((f"{kind} linear", "linear", kind == "moe", t.tokens, t.ms)
                    for kind, t in c.linear.items()),
                  ("head", "head", False, c.head.tokens, c.head.ms)]
        for what, part, moe, x, ms in curves:
            at_peak = flops.part_flops(part, x, spec, moe=moe) * ms_per_flop  # the knots' work
            judged = at_peak >= JUDGED_MS
            judged[-1] = True
            efficiency = at_peak / ms
            axis = "L" if part == "attention" else "T"
            too_fast += [_Knot(float(e), f"{mode} {what} curve at {axis}={int(at):,}", float(t))
                         for e, at, t in zip(efficiency[judged], x[judged], ms[judged])
                         if e > 1 + TOLERANCE]
    if not too_fast:
        return None
    worst = max(too_fast)
    return (f"{len(too_fast)} knot(s) of its curves run faster than {info.name} can: the "
            f"{worst.what} takes {worst.ms:.4g} ms, {worst.efficiency:.4g}x the "
            f"{info.peak_bf16_flops / 1e12:.0f} TFLOP/s bf16 peak")

