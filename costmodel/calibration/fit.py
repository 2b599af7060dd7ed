"""From measured points to the curves of a `CostModel` (scipy), with residuals.

- Attention: for each length L the packs of n equal sequences give t(n) = a(L) + n·b(L),
  solved by non-negative least squares (scipy.optimize.nnls). b(L) is the per-sequence
  cost the model keeps (made monotone in L by isotonic regression); a(L), the per-call
  cost, enters the per-layer overhead. Lengths measured with a single n borrow the median a.
- Token curves (linear, head): isotonic regression of the medians on the token grid
  (scipy.optimize.isotonic_regression, weighted by 1/spread²) and then piecewise-linear
  interpolation: noise that would make cost fall with more tokens is pooled away, while a
  step *up* (a new GEMM wave) is kept as measured.
- Per-layer overhead: inverse-variance weighted mean over "layer" probes of
  t_layer − linear(T) − Σ b(L_i), which is the attention call cost plus whatever glue the
  layer adds; without probes, the median a.
- Residuals: relative error of the fitted model at every measured point, kept in the file.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import isotonic_regression, nnls

from costmodel.calibration.plan import KINDS, SWEEP_KINDS, point_ms
from costmodel.curves import MODES, AttentionCurve, ModeCurves, TokenCurve
from costmodel.flops import MAX_LENGTH

__all__ = ["Record", "fit_attention", "fit_mode", "fit_token_curve", "residuals", "token_knots"]

logger = logging.getLogger(__name__)

_MIN_MS = 1e-5  # 10 ns: floor for per-sequence attention that fits to ~0 at tiny L
# A probe's relative spread past this (p90 - p10 a thousand times its median) weighs as this.
_MAX_PROBE_SPREAD = 1e3
# The most of a length's fastest pack that its per-call cost may be and still be taken as
# the kernel's tail rather than a slow measurement (see fit_attention).
_TAIL_SHARE = 0.15


@dataclass(frozen=True)
class Record:
    """One measured point: what was run and how long it took."""

    kind: str
    mode: str
    lengths: tuple[int, ...]
    ms: float
    spread: float = 0.0
    moe: bool = False

    @property
    def tokens(self) -> int:
        return int(sum(self.lengths))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"kind": self.kind, "mode": self.mode, "ms": self.ms,
                             "spread": round(self.spread, 5), "tokens": self.tokens}
        if self.kind == "attention":
            d.update(length=int(self.lengths[0]), n=len(self.lengths))
        elif self.kind in ("layer", "stack"):
            d["lengths"] = list(self.lengths)
        if self.moe:
            d["moe"] = True
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Record:
        """A stored measurement; ValueError saying what is impossible about it."""
        if d["kind"] not in KINDS or d["mode"] not in MODES:
            raise ValueError(f"unknown kind {d['kind']!r} or mode {d['mode']!r}")
        if d["kind"] not in SWEEP_KINDS:  # validate's stacks are stored with its results
            raise ValueError(f"kind {d['kind']!r} is not measured by a calibration sweep; "
                             f"a sweep's kinds are {', '.join(SWEEP_KINDS)}")
        if d["kind"] == "attention":
            lengths = (_whole(d["length"], "length"),) * _whole(d["n"], "n", _MAX_PACK)
        elif "lengths" in d:
            if not isinstance(d["lengths"], list):
                raise ValueError(f"lengths must be a list, got {d['lengths']!r:.40}")
            lengths = tuple(_whole(x, "a length") for x in d["lengths"])
        else:
            lengths = (_whole(d["tokens"], "tokens"),)
        if not lengths:
            raise ValueError("it holds no sequence")
        moe = d.get("moe", False)
        if not isinstance(moe, bool):  # "false" would read as True
            raise ValueError(f"moe must be true or false, got {moe!r}")
        ms, spread = _number(d["ms"], "ms"), _number(d.get("spread", 0.0), "spread")
        check_time(ms, spread)
        return cls(d["kind"], d["mode"], lengths, ms, spread, moe)


# The most sequences one measured pack holds (1M tokens of 1-token sequences).
_MAX_PACK = 1 << 20


def _whole(value: Any, what: str, most: int = MAX_LENGTH) -> int:
    """An int in 1..``most`` as stored (1.7 and "123" are not lengths)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise ValueError(f"{what} must be a whole number in 1..{most:,}, got {value!r:.40}")
    return value


def _number(value: Any, what: str) -> float:
    """A stored number as a float ("1.0" and true are not times)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} must be a number, got {value!r:.40}")
    return float(value)


def check_time(ms: float, spread: float) -> None:
    """ValueError unless ``ms`` is a possible kernel time and ``spread`` a possible spread
    (for stored measurements and for what a timer returns alike)."""
    if not 0.0 < ms < _MAX_MS or not 0.0 <= spread < math.inf:
        raise ValueError(f"ms={ms!r}, spread={spread!r}: a time must be > 0 and below "
                         f"{_MAX_MS:.0e} ms, a spread finite and >= 0")


# No kernel call of a calibration sweep takes anywhere near this long (~3 hours).
_MAX_MS = 1e7


def _weights(spreads: np.ndarray) -> np.ndarray:
    return 1.0 / np.maximum(np.asarray(spreads, dtype=np.float64), 0.01) ** 2


def fit_attention(records: list[Record]) -> tuple[AttentionCurve, float, dict[str, Any]]:
    """(per-sequence curve b(L), per-call cost a in ms, details) from attention packs."""
    by_len: dict[int, list[Record]] = defaultdict(list)
    for r in records:
        by_len[int(r.lengths[0])].append(r)
    if len(by_len) < 2:
        raise ValueError(f"attention fit needs at least 2 lengths, got {sorted(by_len)}")
    per_call: dict[int, float] = {}
    per_seq: dict[int, float] = {}
    single: list[int] = []
    for L, rs in sorted(by_len.items()):
        n = np.array([len(r.lengths) for r in rs], dtype=np.float64)
        t = np.array([r.ms for r in rs])
        if np.unique(n).size >= 2:
            # Relative least squares: divide each row by t so long packs do not dominate.
            A = np.stack([np.ones_like(n), n], axis=1) / t[:, None]
            (a, b), _ = nnls(A, np.ones_like(t))
            per_call[L], per_seq[L] = float(a), float(b)
        else:
            single.append(L)
    call_ms = float(np.median(list(per_call.values()))) if per_call else 0.0
    # A per-call cost far above the others is a slow measurement, not a real cost: with two
    # or three pack sizes, one slow n = 1 pack tilts the line to a large a(L) and a small
    # b(L) (a 30% slow pack at the longest length cut b there by 30%). Such lengths take
    # the median a, and b from their fastest pack: interference only ever slows a pack
    # down, so the smallest (t - a) / n is the one it spared. "Far": 5x the median, 10
    # median deviations, and a share of the pack's own time a kernel's tail cannot explain.
    # The tail is real: a(L) creeps with L (the last query blocks of one long sequence run
    # on few SMs; 0.08 -> 0.52 ms from 2k to 13k in the H200 profile's forward, 6-12% of
    # one sequence), and without the share a graph-timed sweep (a call cost of microseconds)
    # took that creep for slow packs at every length from 3k and biased b up by 3%.
    spread = float(np.median([abs(a - call_ms) for a in per_call.values()])) if per_call else 0.0
    fastest = {L: min(r.ms for r in rs) for L, rs in by_len.items()}
    tilted = [L for L, a in per_call.items()
              if a - call_ms > max(10 * spread, 4 * call_ms, _TAIL_SHARE * fastest[L])]
    for L in tilted:
        n = np.array([len(r.lengths) for r in by_len[L]], dtype=np.float64)
        t = np.array([r.ms for r in by_len[L]])
        per_seq[L] = float(max(np.min((t - call_ms) / n), 0.0))
    if tilted:
        logger.warning("attention: per-call cost at L=%s far from the others' %.4f ms (a slow "
                       "measurement?); fitted those lengths with it", tilted, call_ms)
    for L in single:
        rs = by_len[L]
        per_seq[L] = float(np.median([(r.ms - call_ms) / len(r.lengths) for r in rs]))
    lengths = np.array(sorted(per_seq), dtype=np.float64)
    raw = np.array([per_seq[int(L)] for L in lengths])
    weights = np.array([len(by_len[int(L)]) for L in lengths], dtype=np.float64)
    # Non-decreasing, and within the floored input's range (scipy's contract): >= _MIN_MS.
    mono = isotonic_regression(np.maximum(raw, _MIN_MS), weights=weights, increasing=True).x
    details = {
        "per_call_ms": {str(int(k)): v for k, v in sorted(per_call.items())},
        "per_sequence_ms_raw": {str(int(L)): float(v) for L, v in zip(lengths, raw)},
        "call_ms": call_ms,
        "single_pack_lengths": single,
        "refit_with_median_call_lengths": sorted(tilted),
    }
    return AttentionCurve(lengths, mono, what="attention fit"), call_ms, details


def fit_token_curve(records: list[Record], what: str) -> TokenCurve:
    """Monotone piecewise-linear curve through the medians at each token count."""
    tokens, _, mono = token_knots(records, what)
    return TokenCurve(tokens, mono, what=what)


def token_knots(records: list[Record], what: str, *, warn: bool = True
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token counts, the median time measured at each, the monotone fit there) of one
    token curve's records (a count measured again has several: `retake`); ``warn``: log
    each knot taken as a slow measurement."""
    by_t: dict[int, list[Record]] = defaultdict(list)
    for r in records:
        by_t[r.tokens].append(r)
    if len(by_t) < 2:
        raise ValueError(f"{what} fit needs at least 2 token counts, got {sorted(by_t)}")
    tokens = np.array(sorted(by_t), dtype=np.float64)
    measured = np.array([np.median([r.ms for r in by_t[int(t)]]) for t in tokens])
    spreads = np.array([np.median([r.spread for r in by_t[int(t)]]) for t in tokens])
    ms = _without_spikes(tokens, measured, what, warn)
    mono = isotonic_regression(np.maximum(ms, _MIN_MS), weights=_weights(spreads), increasing=True).x
    return tokens, measured, mono


# A knot this far above what its neighbours predict is a slow measurement (a clock dip, a
# stray process), not a GEMM step: those are a few percent (6% on an H200 at 11.6k vs 16k
# tokens). Isotonic regression cannot undo it: it only pools points that fall.
_SPIKE = 1.5


def _without_spikes(tokens: np.ndarray, ms: np.ndarray, what: str, warn: bool = True) -> np.ndarray:
    """``ms`` with each knot far above its neighbours' line replaced by that line: between
    the two neighbours inside the grid, extrapolated from the two before it at the end
    (one spike at the last knot set the whole tail: 10x slow made the curve 10x too high
    from there on)."""
    out = ms.copy()
    for i in range(1, tokens.size):
        if i + 1 < tokens.size:
            lo, hi = i - 1, i + 1
        elif i >= 2:
            lo, hi = i - 2, i - 1
        else:
            continue
        slope = max((out[hi] - out[lo]) / (tokens[hi] - tokens[lo]), 0.0)
        expected = out[lo] + slope * (tokens[i] - tokens[lo])
        if expected > 0 and out[i] > _SPIKE * expected:
            if warn:
                logger.warning("%s: the point at %d tokens (%.4g ms) is %.1fx its neighbours' "
                               "line; taken as a slow measurement and replaced by that line",
                               what, int(tokens[i]), out[i], out[i] / expected)
            out[i] = expected
    return out


def fit_mode(records: list[Record], mode: str, *, needs: tuple[str, ...]) -> tuple[ModeCurves, dict[str, Any]]:
    """All curves of one pass from its records; `needs` lists the linear kinds required."""
    rs = [r for r in records if r.mode == mode]
    attn_rs = [r for r in rs if r.kind == "attention"]
    if not attn_rs:
        raise ValueError(f"no attention measurements for mode {mode!r}")
    attention, call_ms, attn_details = fit_attention(attn_rs)
    linear = {}
    for kind in needs:
        lin = [r for r in rs if r.kind == "linear" and r.moe == (kind == "moe")]
        if not lin:
            raise ValueError(f"no {kind} linear measurements for mode {mode!r}")
        linear[kind] = fit_token_curve(lin, f"{mode} {kind} linear fit")
    head_rs = [r for r in rs if r.kind == "head"]
    if not head_rs:
        raise ValueError(f"no head measurements for mode {mode!r}")
    head = fit_token_curve(head_rs, f"{mode} head fit")
    probes = [r for r in rs if r.kind == "layer"]
    glue, weights = [], []
    for r in probes:
        kind = "moe" if r.moe else "dense"
        if kind not in linear:
            continue
        L = np.asarray(r.lengths, dtype=np.float64)
        glue.append(r.ms - float(linear[kind](r.tokens)) - float(attention(L).sum()))
        # Inverse-variance weights: the glue is a small difference of large times, and a
        # probe's absolute noise is its time × its relative spread. Both bounded: a stored
        # spread of 1e300 overflowed when squared, an ms of 1e-200 squared to 0 (a file's
        # wild probe now weighs next to nothing, or as the fit's smallest time).
        noise = max(r.ms, _MIN_MS) * min(max(r.spread, 0.005), _MAX_PROBE_SPREAD)
        weights.append(1.0 / noise**2)
    if not glue:
        logger.warning("%s: no whole-layer probes; the per-layer overhead is the attention "
                       "call's cost alone (%.4f ms), without the layer's glue", mode, call_ms)
    per_layer = float(np.average(glue, weights=weights)) if glue else call_ms
    if per_layer < 0:
        logger.warning(
            "%s: layer probes run %.3f ms faster than linear + attention predict; per-layer "
            "overhead clamped to 0", mode, -per_layer,
        )
        per_layer = 0.0
    curves = ModeCurves(attention=attention, linear=linear, head=head,
                        layer_overhead_ms=per_layer, microbatch_overhead_ms=0.0)
    details = {"attention": attn_details, "layer_glue_ms": [float(g) for g in glue],
               "per_layer_ms": per_layer}
    return curves, details


def residuals(curves: ModeCurves, records: list[Record], call_ms: float) -> dict[str, Any]:
    """Relative residuals (predicted / measured − 1) by kind: rms, worst, and per point."""
    out: dict[str, Any] = {}
    by_kind: dict[str, list[tuple[Record, float]]] = defaultdict(list)
    for r in records:
        by_kind[r.kind + (" moe" if r.moe else "")].append((r, point_ms(curves, r, call_ms) / r.ms - 1.0))
    for kind, items in by_kind.items():
        rel = np.array([e for _, e in items])
        worst = int(np.argmax(np.abs(rel)))
        scale = float(np.abs(rel[worst])) or 1.0  # a wild point's 1e200 squared overflowed
        out[kind] = {
            "rms": scale * float(np.sqrt(np.mean((rel / scale) ** 2))),
            "max_abs": float(np.abs(rel[worst])),
            "worst_point": items[worst][0].to_dict(),
            "relative": [round(float(e), 5) for e in rel],
        }
    return out
