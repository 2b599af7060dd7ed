"""Curves no GPU can run: a cost model's largest knots against its GPU's peak FLOP/s.

`calibrate` checks every measured point against the registry's peak
(`calibration.check.flops_check`); this checks what a file carries, its fitted curves, so
that a file whose numbers were edited or corrupted into ones no GPU reaches is refused on
load (a train attention curve of 1e-9 ms loaded and the scheduler balanced as if attention
were free) and a correction that would write one is refused (`costmodel correct`).

Each part's largest knot is checked (one sequence's attention core at the longest length,
one layer's token-linear part and the LM head at the most tokens; matmul FLOPs from
`costmodel.flops` as in the calibration check, x3 for training): there a part does the
most work and a measurement amortises its per-call cost. Not the short lengths: their
per-sequence attention is what a pack's time leaves after the per-call cost, and may fit
down to the fit's floor of 10 ns (`calibration.fit`), a split of the time, not a speed.
The curves are non-decreasing, so a curve scaled or edited down as a whole is caught at
its top. Not checked: fixed costs (no FLOPs) and GPUs the registry lacks (no peak).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from costmodel import flops, gpus

if TYPE_CHECKING:
    from costmodel.model import CostModel

__all__ = ["TOLERANCE", "curves_beyond_peak"]

# As the calibration check's: a knot may reach 5% past the datasheet peak (boost clocks, a
# fit's smoothing) before it is impossible. The shipped H200 profile peaks at 61%.
TOLERANCE = 0.05


class _Knot(NamedTuple):
    efficiency: float
    what: str
    ms: float


def curves_beyond_peak(model: CostModel) -> str | None:
    """Which of ``model``'s curves run faster than its GPU can at their largest knot (the
    fastest, as a multiple of the peak, and how many), or None when none does or no peak
    is known."""
    info = _registry_entry(model)
    if info is None:
        return None
    spec = model.rank_spec
    too_fast: list[_Knot] = []
    for mode in model.modes:
        c = model.curves[mode]
        to_efficiency = flops.pass_factor(mode) * 1e3 / info.peak_bf16_flops  # (FLOPs / ms) -> share of peak
        curves = [("attention", c.attention.lengths, c.attention.ms),
                  *((f"{kind} linear", t.tokens, t.ms) for kind, t in c.linear.items()),
                  ("head", c.head.tokens, c.head.ms)]
        for part, x, ms in curves:
            at, took = int(x[-1]), float(ms[-1])  # a hand-made knot between tokens: its floor
            if part == "attention":
                work = float(flops.attention_core_flops(np.array([at]), spec)[0])
            elif part == "head":
                work = at * float(flops.lm_head_flops_per_token(spec))
            else:
                work = float(flops.layer_linear_flops(at, spec, moe=part == "moe linear"))
            efficiency = work * to_efficiency / took
            if efficiency > 1 + TOLERANCE:
                axis = "L" if part == "attention" else "T"
                too_fast.append(_Knot(efficiency, f"{mode} {part} curve at {axis}={at:,}", took))
    if not too_fast:
        return None
    worst = max(too_fast)
    return (f"{len(too_fast)} of its curves run faster than {info.name} can: the "
            f"{worst.what} takes {worst.ms:.4g} ms, {worst.efficiency:.4g}x the "
            f"{info.peak_bf16_flops / 1e12:.0f} TFLOP/s bf16 peak")


def _registry_entry(model: CostModel) -> gpus.GpuInfo | None:
    """The GPU the file was made for: its registry key, else (files from before the key,
    or a key this registry lacks) the entry of its device name, as `report` finds it."""
    try:
        return gpus.lookup_gpu(str(model.gpu_key))
    except ValueError:
        return gpus.find_gpu_by_device_name(model.gpu)
