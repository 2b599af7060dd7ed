"""Curves no GPU can run: a cost model's knots against its GPU's peak FLOP/s.

`calibrate` checks every measured point against the registry's peak
(`calibration.check.flops_check`); this checks what a file carries, its fitted curves, so
that a file whose numbers were edited or corrupted into ones no GPU reaches is refused on
load (a train attention curve of 1e-9 ms loaded and the scheduler balanced as if attention
were free) and a correction that would write one is refused (`costmodel correct`).

Each knot's matmul FLOPs come from `costmodel.flops` as in the calibration check (one
sequence's attention core, one layer's token-linear part, the LM head; x3 for training).
Knots between whole tokens (none that calibration writes) and the fixed costs (no FLOPs)
are not checked, nor are GPUs the registry lacks (no peak to check against).
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
    """What in ``model``'s curves runs faster than its GPU can (the fastest such knot, as
    a fraction of the peak, and how many), or None when nothing does or no peak is known."""
    info = _registry_entry(model)
    if info is None:
        return None
    spec = model.rank_spec
    knots: list[_Knot] = []
    for mode in model.modes:
        c = model.curves[mode]
        to_efficiency = flops.pass_factor(mode) * 1e3 / info.peak_bf16_flops  # (FLOPs / ms) -> share of peak
        curves = [("attention", c.attention.lengths, c.attention.ms),
                  *((f"{kind} linear", t.tokens, t.ms) for kind, t in c.linear.items()),
                  ("head", c.head.tokens, c.head.ms)]
        for part, x, ms in curves:
            whole = x == np.round(x)
            at, ms = x[whole], ms[whole]
            if part == "attention":
                work = flops.attention_core_flops(at.astype(np.int64), spec)
            elif part == "head":
                work = at * float(flops.lm_head_flops_per_token(spec))
            else:
                work = flops.layer_linear_flops(at, spec, moe=part == "moe linear")
            axis = "L" if part == "attention" else "T"
            knots += [_Knot(float(e), f"{mode} {part} curve at {axis}={int(a)}", float(m))
                      for e, a, m in zip(work * to_efficiency / ms, at, ms) if e > 1 + TOLERANCE]
    if not knots:
        return None
    worst = max(knots)
    return (f"{len(knots)} knot(s) of its curves run faster than {info.name} can: the "
            f"{worst.what} takes {worst.ms:.4g} ms, {worst.efficiency:.4g}x the "
            f"{info.peak_bf16_flops / 1e12:.0f} TFLOP/s bf16 peak")


def _registry_entry(model: CostModel) -> gpus.GpuInfo | None:
    """The GPU the file was made for: its registry key, else (files from before the key,
    or a key this registry lacks) the entry of its device name, as `report` finds it."""
    try:
        return gpus.lookup_gpu(str(model.gpu_key))
    except ValueError:
        return gpus.find_gpu_by_device_name(model.gpu)
