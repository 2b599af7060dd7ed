"""The fitted cost curves of one model on one GPU, and their dict form.

A cost model holds, per pass `mode` in {"train", "forward"} (`MODES`), one `ModeCurves`:

- `attention` (`AttentionCurve`): attention core of one sequence in one layer (ms) against
  its length L. Monotone PCHIP through the measured knots in log-log space; past the
  longest knot it grows as L² (causal attention does L(L+1)/2 query-key pairs), below the
  shortest as a power of L matching the curve's log-log slope there (clipped to [0, 2]).
- `linear` (`TokenCurve`s, "dense" and/or "moe"): the token-linear part of one layer
  (projections, norms, MLP or MoE) against the micro-batch's token count T. Piecewise-
  linear through the measured knots on a fine grid, *not* a smooth fit: GEMM tile and wave
  quantisation put steps in time per token (on an H200 a Qwen3-8B layer costs ~6% less per
  token at 11.6k tokens than at 16k) and a smooth fit would average them away.
  Interpolating time (not time per token) keeps the curve monotone between knots; on a
  fine grid the two are the same. Below the first knot the curve is flat (launch- and
  weight-read-bound), above the last it continues at the last knot's time per token.
- `head` (`TokenCurve`): final norm + LM head + loss, same kind of curve as `linear`.
- `layer_overhead_ms` / `microbatch_overhead_ms`: fixed costs per layer call and per
  micro-batch.

`to_dict` gives each curve's part of the file format (`costmodel.model_file` reads it back
and validates it). Numpy/scipy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from costmodel import portable
from costmodel.flops import MAX_LENGTH

__all__ = ["MODES", "AttentionCurve", "ModeCurves", "TokenCurve", "checked_mode"]

MODES = ("train", "forward")
# The times a knot may take: past them a file is broken, not measured (see _knots).
_MIN_MS, _MAX_MS = 1e-9, 1e9


def checked_mode(mode: str) -> str:
    """`mode` if it is a pass (`MODES`); else a ValueError listing them."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
    return mode


def _knots(x: ArrayLike, y: ArrayLike, xname: str, what: str) -> tuple[np.ndarray, np.ndarray]:
    for values in (x, y):  # numpy would read "0.004" or True as a number
        if isinstance(values, (list, tuple)):
            bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, float, np.number))]
            if bad:
                raise ValueError(f"{what}: knots must be numbers, got {bad[0]!r:.60}")
    xs = np.asarray(x, dtype=np.float64)
    ys = np.asarray(y, dtype=np.float64)
    if xs.ndim != 1 or ys.shape != xs.shape or xs.size < 2:
        raise ValueError(
            f"{what}: needs matching 1-D lists of {xname} and ms with at least 2 knots, "
            f"got {xs.size} {xname} and {ys.size} ms"
        )
    if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
        raise ValueError(f"{what}: knots must be finite numbers")
    if np.any(xs < 1) or np.any(np.diff(xs) <= 0):
        raise ValueError(f"{what}: {xname} must be >= 1 and strictly increasing")
    if xs[-1] > MAX_LENGTH:  # past any sequence or micro-batch: 1e300 tokens overflowed int64
        raise ValueError(f"{what}: {xname} must be at most {MAX_LENGTH:,} (2^31 - 1, the most "
                         f"one micro-batch holds), got {xs[-1]:g}: not a measurement")
    if np.any(ys <= 0):
        raise ValueError(f"{what}: times must be positive, got min {ys.min():g} ms")
    if ys.min() < _MIN_MS or ys.max() > _MAX_MS:  # 1e-320 ms evaluated to 0, 1e306 overflowed
        raise ValueError(f"{what}: times must lie between {_MIN_MS:g} and {_MAX_MS:g} ms (a "
                         f"picosecond to 11 days), got {ys.min():g}..{ys.max():g} ms: not a "
                         "measurement; recalibrate or restore the file")
    if np.any(np.diff(ys) < 0):
        i = int(np.argmax(np.diff(ys) < 0))
        raise ValueError(
            f"{what}: curve is not monotone: {ys[i]:g} ms at {xname}={xs[i]:g} but "
            f"{ys[i + 1]:g} ms at {xname}={xs[i + 1]:g} (cost must not fall as size grows)"
        )
    return xs, ys


class AttentionCurve:
    """Attention core time of one sequence in one layer (ms) as a function of its length."""

    interpolation = "pchip-loglog"  # what the file says, and what its reader checks

    def __init__(self, lengths: ArrayLike, ms: ArrayLike, *, what: str = "attention curve"):
        self.lengths, self.ms = _knots(lengths, ms, "lengths", what)
        # portable, not numpy's exp/log: every rank must price a sample to the same bit.
        self._lx, self._ly = portable.log(self.lengths), portable.log(self.ms)
        same_log = np.diff(self._lx) <= 0  # 1000 and 1000.0000000000001: one log
        if same_log.any():
            i = int(np.argmax(same_log))
            pair = float(self.lengths[i]), float(self.lengths[i + 1])
            raise ValueError(f"{what}: lengths {pair[0]!r} and {pair[1]!r} are too close to tell "
                             "apart; knots are whole tokens")
        # scipy.interpolate costs ~0.4 s to import: only when a curve is built, not at
        # `import costmodel` (every training process, `costmodel --help`).
        from scipy.interpolate import PchipInterpolator

        self._pchip = PchipInterpolator(self._lx, self._ly, extrapolate=False)
        slope = float(self._pchip.derivative()(self._lx[0]))
        self.low_exponent = float(np.clip(slope, 0.0, 2.0))
        self.tail_exponent = 2.0

    def __call__(self, lengths: ArrayLike) -> np.ndarray:
        L = np.asarray(lengths, dtype=np.float64)
        out = np.empty_like(L)
        lo, hi = self.lengths[0], self.lengths[-1]
        below, above = lo > L, hi < L
        inside = ~(below | above)
        # Within the end knots' times: exp(log(t)) can come back an ulp under t at the first
        # knot, a step down from the constant just below it (the curve must never fall).
        out[inside] = np.clip(portable.exp(self._pchip(portable.log(L[inside]))),
                              self.ms[0], self.ms[-1])
        out[below] = self.ms[0] * portable.power(L[below] / lo, self.low_exponent)
        out[above] = self.ms[-1] * portable.power(L[above] / hi, self.tail_exponent)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "lengths": [int(x) if float(x).is_integer() else float(x) for x in self.lengths],
            "ms": [float(y) for y in self.ms],
            "interpolation": self.interpolation,
            "low_exponent": self.low_exponent,
            "tail_exponent": self.tail_exponent,
        }


class TokenCurve:
    """Time (ms) of a token-linear block as a function of the micro-batch's token count."""

    interpolation = "piecewise-linear"

    def __init__(self, tokens: ArrayLike, ms: ArrayLike, *, what: str = "token curve"):
        self.tokens, self.ms = _knots(tokens, ms, "tokens", what)

    def __call__(self, tokens: ArrayLike) -> np.ndarray:
        t = np.asarray(tokens, dtype=np.float64)
        out = np.interp(t, self.tokens, self.ms)  # flat below the first knot
        above = t > self.tokens[-1]
        if np.any(above):
            out = np.where(above, self.ms[-1] * t / self.tokens[-1], out)
        return out

    def marginal_per_token(self, reference_tokens: float) -> float:
        """Secant slope over [T/2, 3T/2]: the cost of one more token near T tokens."""
        t = float(reference_tokens)
        lo, hi = self(np.array([0.5 * t, 1.5 * t]))
        return float(max(hi - lo, 0.0) / t)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": [int(x) if float(x).is_integer() else float(x) for x in self.tokens],
            "ms": [float(y) for y in self.ms],
            "interpolation": self.interpolation,
        }


@dataclass(kw_only=True)
class ModeCurves:
    """Everything needed to predict one pass (train or forward) of one model on one GPU."""

    attention: AttentionCurve
    linear: dict[str, TokenCurve]
    """"dense" and/or "moe": one layer's token-linear part."""
    head: TokenCurve
    layer_overhead_ms: float = 0.0
    """Paid once per layer per micro-batch (attention call cost, glue)."""
    microbatch_overhead_ms: float = 0.0
    """Paid once per micro-batch."""

    def __post_init__(self) -> None:
        # As a knot's time (`_knots`): 5e306 ms per layer loaded once and priced every
        # micro-batch at inf.
        for name in ("layer_overhead_ms", "microbatch_overhead_ms"):
            value = getattr(self, name)
            if not 0 <= value <= _MAX_MS:  # also NaN
                raise ValueError(f"{name} must lie between 0 and {_MAX_MS:g} ms, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "overhead": {
                "per_layer_ms": float(self.layer_overhead_ms),
                "per_microbatch_ms": float(self.microbatch_overhead_ms),
            },
            "attention": self.attention.to_dict(),
            "linear": {k: c.to_dict() for k, c in self.linear.items()},
            "head": self.head.to_dict(),
        }

