"""CostModel: measured (or estimated) cost curves -> predicted milliseconds per micro-batch.

The model (DESIGN.md, "Data flow" 4), per pass `mode` in {"train", "forward"}:

    microbatch_cost(lengths) = overhead + Σ_layers (Σ_i attn(L_i) + linear(Σ_i L_i)) + head(Σ_i L_i)
    overhead = layers × per_layer_ms + per_microbatch_ms

- `attn(L)`: attention core of one sequence in one layer (ms). Monotone PCHIP through the
  measured knots in log-log space; past the longest knot it grows as L² (causal attention
  does L(L+1)/2 query-key pairs), below the shortest as a power of L matching the curve's
  log-log slope there (clipped to [0, 2]). Sliding-window layers reuse it: past the window
  W every extra query attends to a full window, so attn_W(L) = attn(W) · pairs_W(L) / pairs(W)
  with pairs_W(L) = W(W+1)/2 + (L−W)·W, the exact pair count (see costmodel.flops).
- `linear(T)`: the token-linear part of one layer (projections, norms, MLP or MoE) at T
  tokens, dense and MoE layers with separate curves. Piecewise-linear through the measured
  knots on a fine grid, *not* a smooth fit: GEMM tile and wave quantisation put steps in
  time per token (on an H200 a Qwen3-8B layer costs ~6% less per token at 11.6k tokens
  than at 16k) and a smooth fit would average them away. Interpolating time (not time per
  token) keeps the curve monotone between knots; on a fine grid the two are the same.
  Below the first knot the curve is flat (launch- and weight-read-bound), above the last
  it continues at the last knot's time per token.
- `head(T)`: final norm + LM head + loss, same kind of curve as `linear`.
- `per_layer_ms`: the part of a layer that is paid per call, not per token or per sequence
  (the attention call's fixed cost, measured by fitting packs of n equal sequences as
  a(L) + n·b(L)); `per_microbatch_ms`: anything else paid once per micro-batch.

`sample_cost(L)` is the marginal cost of one sample in a micro-batch, the per-length curve a
scheduler balances: layers × attn(L) + L × (marginal linear + head cost per token at a
reference micro-batch size, `reference_tokens`, default 8192). The per-token slope is the
secant over [T/2, 3T/2] so that single GEMM steps do not dominate it.

The file format (`"schema": "costmodel/1"`) is validated on load; every problem is a
ValueError naming the file and what is wrong. Numpy/scipy only.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import math
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.interpolate import PchipInterpolator

from costmodel.flops import as_lengths
from costmodel.spec import ModelSpec

__all__ = [
    "MODES",
    "SCHEMA",
    "AttentionCurve",
    "CostModel",
    "ModeCurves",
    "TokenCurve",
    "load_cost_model",
    "write_json_atomic",
]

logger = logging.getLogger(__name__)

SCHEMA = "costmodel/1"
MODES = ("train", "forward")
DEFAULT_REFERENCE_TOKENS = 8192
# Attention is tabulated per integer length up to this (or the longest knot, if longer,
# up to _MAX_TABLE); longer lengths are evaluated directly.
_MIN_TABLE = 16384
_MAX_TABLE = 1 << 18

_REQUIRED_FIELDS = ("schema", "created", "is_estimate", "gpu", "spec", "spec_fingerprint", "curves")


# ---- curves ---------------------------------------------------------------------------------
def _knots(x: ArrayLike, y: ArrayLike, xname: str, what: str) -> tuple[np.ndarray, np.ndarray]:
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
    if np.any(ys <= 0):
        raise ValueError(f"{what}: times must be positive, got min {ys.min():g} ms")
    if np.any(np.diff(ys) < 0):
        i = int(np.argmax(np.diff(ys) < 0))
        raise ValueError(
            f"{what}: curve is not monotone: {ys[i]:g} ms at {xname}={xs[i]:g} but "
            f"{ys[i + 1]:g} ms at {xname}={xs[i + 1]:g} (cost must not fall as size grows)"
        )
    return xs, ys


class AttentionCurve:
    """Attention core time of one sequence in one layer (ms) as a function of its length."""

    def __init__(self, lengths: ArrayLike, ms: ArrayLike, *, what: str = "attention curve"):
        self.lengths, self.ms = _knots(lengths, ms, "lengths", what)
        self._lx, self._ly = np.log(self.lengths), np.log(self.ms)
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
        out[inside] = np.exp(self._pchip(np.log(L[inside])))
        out[below] = self.ms[0] * (L[below] / lo) ** self.low_exponent
        out[above] = self.ms[-1] * (L[above] / hi) ** self.tail_exponent
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "lengths": [int(x) if float(x).is_integer() else float(x) for x in self.lengths],
            "ms": [float(y) for y in self.ms],
            "interpolation": "pchip-loglog",
            "low_exponent": self.low_exponent,
            "tail_exponent": self.tail_exponent,
        }


class TokenCurve:
    """Time (ms) of a token-linear block as a function of the micro-batch's token count."""

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
            "interpolation": "piecewise-linear",
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


@dataclass
class _Tables:
    """Per-mode precomputation for the vectorised evaluation."""

    attn_table: np.ndarray  # Σ over layers of attention for one sequence of length L, index L
    overhead: float
    linear_terms: list[tuple[float, TokenCurve]] = field(default_factory=list)
    per_token_marginal: float = 0.0


# ---- the model --------------------------------------------------------------------------------
class CostModel:
    """Predicted time of micro-batches of packed variable-length sequences, in milliseconds."""

    def __init__(
        self,
        *,
        spec: ModelSpec,
        gpu: str,
        curves: Mapping[str, ModeCurves],
        is_estimate: bool = False,
        provenance: Mapping[str, Any] | None = None,
        gpu_key: str | None = None,
        reference_tokens: int = DEFAULT_REFERENCE_TOKENS,
        extra: Mapping[str, Any] | None = None,
    ):
        if not curves:
            raise ValueError("a CostModel needs curves for at least one mode")
        bad = sorted(set(curves) - set(MODES))
        if bad:
            raise ValueError(f"unknown modes {bad}; allowed: {list(MODES)}")
        needed = [k for k, n in (("dense", spec.num_dense_layers), ("moe", spec.num_moe_layers)) if n]
        for mode, c in curves.items():
            missing = [k for k in needed if k not in c.linear]
            if missing:
                raise ValueError(
                    f"{mode} curves lack the linear curve(s) {missing} that {spec.name} needs "
                    f"({spec.num_dense_layers} dense, {spec.num_moe_layers} MoE layers)"
                )
        if reference_tokens < 1:
            raise ValueError(f"reference_tokens must be >= 1, got {reference_tokens}")
        self.spec = spec
        self.gpu = gpu
        self.gpu_key = gpu_key
        self.curves = dict(curves)
        self.is_estimate = bool(is_estimate)
        self.provenance = dict(provenance or {})
        self.reference_tokens = int(reference_tokens)
        self.extra: dict[str, Any] = dict(extra or {})
        self._tables: dict[str, _Tables] = {}

    # ---- introspection --------------------------------------------------------------------
    @property
    def modes(self) -> list[str]:
        return [m for m in MODES if m in self.curves]

    @property
    def label(self) -> str:
        kind = "ESTIMATE" if self.is_estimate else "measured"
        return f"{self.spec.name} on {self.gpu} ({kind})"

    def __repr__(self) -> str:
        return f"CostModel({self.label}, modes={self.modes})"

    def _mode(self, mode: str) -> ModeCurves:
        if mode not in self.curves:
            raise ValueError(
                f"mode {mode!r} is not in this cost model ({self.label}); it has {self.modes}"
            )
        return self.curves[mode]

    # ---- attention over layers -------------------------------------------------------------
    def _attn_all_layers(self, c: ModeCurves, lengths: np.ndarray) -> np.ndarray:
        """Σ over layers of attention time for each sequence (float lengths >= 1)."""
        spec = self.spec
        n_sw = spec.sliding_window_layers
        n_full = spec.num_layers - n_sw
        out = n_full * c.attention(lengths) if n_full else np.zeros(lengths.shape)
        if n_sw:
            w = float(spec.sliding_window)
            L = np.asarray(lengths, dtype=np.float64)
            pairs_w = w * (w + 1) / 2
            capped = np.minimum(L, w)
            windowed = c.attention(capped) * np.where(w < L, (pairs_w + (L - w) * w) / pairs_w, 1.0)
            out = out + n_sw * windowed
        return out

    def _tables_for(self, mode: str) -> _Tables:
        tables = self._tables.get(mode)
        if tables is not None:
            return tables
        c = self._mode(mode)
        spec = self.spec
        top = int(min(max(_MIN_TABLE, c.attention.lengths[-1]), _MAX_TABLE))
        table = np.zeros(top + 1)
        table[1:] = self._attn_all_layers(c, np.arange(1, top + 1, dtype=np.float64))
        terms = []
        if spec.num_dense_layers:
            terms.append((float(spec.num_dense_layers), c.linear["dense"]))
        if spec.num_moe_layers:
            terms.append((float(spec.num_moe_layers), c.linear["moe"]))
        terms.append((1.0, c.head))
        marginal = sum(w * curve.marginal_per_token(self.reference_tokens) for w, curve in terms)
        tables = _Tables(
            attn_table=table,
            overhead=spec.num_layers * c.layer_overhead_ms + c.microbatch_overhead_ms,
            linear_terms=terms,
            per_token_marginal=marginal,
        )
        self._tables[mode] = tables
        return tables

    def _attn_lookup(self, mode: str, lengths: np.ndarray) -> np.ndarray:
        t = self._tables_for(mode)
        top = t.attn_table.size - 1
        if lengths.size and int(lengths.max()) > top:
            out = np.empty(lengths.shape)
            small = lengths <= top
            out[small] = t.attn_table[lengths[small]]
            out[~small] = self._attn_all_layers(self._mode(mode), lengths[~small].astype(np.float64))
            return out
        return t.attn_table[lengths]

    # ---- public API --------------------------------------------------------------------------
    def microbatch_costs(self, lengths: ArrayLike, offsets: ArrayLike, mode: str = "train") -> np.ndarray:
        """Cost (ms) of many micro-batches at once, laid out CSR-style.

        `lengths` holds every micro-batch's sequence lengths concatenated; micro-batch j is
        `lengths[offsets[j]:offsets[j+1]]`, so `offsets` has n_microbatches + 1 entries,
        starts at 0 and ends at len(lengths). An empty micro-batch costs 0 (nothing runs).
        """
        L = _as_lengths(lengths)
        off = np.asarray(offsets)
        if off.ndim != 1 or off.size < 1 or off.dtype.kind not in "iu":
            raise ValueError("offsets must be a 1-D integer array with n_microbatches + 1 entries")
        off = off.astype(np.int64, copy=False)
        if off[0] != 0 or off[-1] != L.size or np.any(np.diff(off) < 0):
            raise ValueError(
                f"offsets must start at 0, be non-decreasing and end at len(lengths)={L.size}; "
                f"got first {off[0]}, last {off[-1]}"
            )
        t = self._tables_for(mode)
        attn = self._attn_lookup(mode, L)
        attn_cum = np.concatenate(([0.0], np.cumsum(attn)))
        tok_cum = np.concatenate(([0], np.cumsum(L)))
        attn_sum = attn_cum[off[1:]] - attn_cum[off[:-1]]
        tokens = (tok_cum[off[1:]] - tok_cum[off[:-1]]).astype(np.float64)
        cost = t.overhead + attn_sum
        for weight, curve in t.linear_terms:
            cost += weight * curve(tokens)
        return np.where(tokens > 0, cost, 0.0)

    def microbatch_cost(self, lengths: ArrayLike, mode: str = "train") -> float:
        """Cost (ms) of one micro-batch: these sequences packed and run through the model."""
        L = _as_lengths(lengths)
        return float(self.microbatch_costs(L, np.array([0, L.size]), mode)[0])

    def sample_cost(self, lengths: ArrayLike, mode: str = "train") -> np.ndarray:
        """Marginal cost (ms) of each sample in a micro-batch of ~`reference_tokens` tokens."""
        L = _as_lengths(lengths)
        t = self._tables_for(mode)
        return self._attn_lookup(mode, L) + L * t.per_token_marginal

    def breakdown(self, lengths: ArrayLike, mode: str = "train") -> dict[str, float]:
        """The parts of `microbatch_cost`: overhead, attention, linear, head and total (ms)."""
        L = _as_lengths(lengths)
        c = self._mode(mode)
        t = self._tables_for(mode)
        if L.size == 0:
            return dict.fromkeys(("overhead", "attention", "linear", "head", "total"), 0.0)
        tokens = float(L.sum())
        linear = sum(w * float(curve(tokens)) for w, curve in t.linear_terms[:-1])
        parts = {
            "overhead": float(t.overhead),
            "attention": float(self._attn_lookup(mode, L).sum()),
            "linear": float(linear),
            "head": float(c.head(tokens)),
        }
        parts["total"] = sum(parts.values())
        return parts

    def stack_cost(
        self, lengths: ArrayLike, mode: str = "train", *, num_layers: int, moe: bool = False,
        head: bool = True, microbatch_overhead: bool = False,
    ) -> float:
        """Predicted time of `num_layers` identical layers (+ the head): what `validate` runs."""
        L = _as_lengths(lengths)
        if L.size == 0:
            return 0.0
        c = self._mode(mode)
        kind = "moe" if moe else "dense"
        if kind not in c.linear:
            raise ValueError(f"this cost model has no {kind} linear curve; it has {list(c.linear)}")
        tokens = float(L.sum())
        per_layer = (
            c.layer_overhead_ms + float(c.attention(L.astype(np.float64)).sum())
            + float(c.linear[kind](tokens))
        )
        total = num_layers * per_layer
        if head:
            total += float(c.head(tokens))
        if microbatch_overhead:
            total += c.microbatch_overhead_ms
        return total

    # ---- serialisation -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "created": self.extra.get("created") or _now(),
            "command": self.extra.get("command"),
            "is_estimate": self.is_estimate,
            "gpu": {"key": self.gpu_key, "name": self.gpu},
            "device": self.extra.get("device"),
            "spec": self.spec.to_dict(),
            "spec_fingerprint": self.spec.fingerprint(),
            "kernels": self.extra.get("kernels"),
            "reference_tokens": self.reference_tokens,
            "provenance": self.provenance,
            "curves": {m: self.curves[m].to_dict() for m in self.modes},
            "measurements": self.extra.get("measurements"),
            "residuals": self.extra.get("residuals"),
            "flops_check": self.extra.get("flops_check"),
            "validation": self.extra.get("validation"),
        }
        return doc

    def save(self, path: str | os.PathLike) -> Path:
        """Write the model to `path` atomically (a temp file in the same folder, then rename)."""
        return write_json_atomic(path, self.to_dict())

    @classmethod
    def from_dict(
        cls,
        doc: Any,
        *,
        source: str = "<dict>",
        spec: ModelSpec | None = None,
        allow_other_shape: bool = False,
    ) -> CostModel:
        """Validate a loaded document and build the model; ValueError names what is wrong."""
        return _from_document(doc, source=source, spec=spec, allow_other_shape=allow_other_shape)


# ---- validation of a document -------------------------------------------------------------------
_REWRITE = "write a new file with `costmodel calibrate` (or restore this one)"


def _fail(source: str, message: str, *, fix: str | None = _REWRITE) -> ValueError:
    """One line: which file, what is wrong with it, and what to do."""
    return ValueError(f"cost model {source}: {message}" + (f"; {fix}" if fix else ""))


def _check_finite(obj: Any, source: str, where: str = "") -> None:
    if isinstance(obj, float) and not math.isfinite(obj):
        raise _fail(source, f"non-finite number {obj!r} at {where or 'top level'} "
                    "(cost model files hold finite numbers only)")
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            _check_finite(v, source, f"{where}.{k}" if where else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            _check_finite(v, source, f"{where}[{i}]")


def _require(mapping: Any, key: str, kind: type | tuple[type, ...], source: str, where: str) -> Any:
    if not isinstance(mapping, Mapping) or key not in mapping:
        raise _fail(source, f"missing field {where}{key!r}")
    value = mapping[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise _fail(source, f"field {where}{key!r} has the wrong type {type(value).__name__} "
                    f"(expected {' or '.join(k.__name__ for k in kinds)})")
    return value


def _mode_from_dict(d: Any, mode: str, source: str) -> ModeCurves:
    where = f"curves.{mode}."
    if not isinstance(d, Mapping):
        raise _fail(source, f"{where[:-1]} must be an object")
    overhead = _require(d, "overhead", Mapping, source, where)
    per_layer = _require(overhead, "per_layer_ms", (int, float), source, where + "overhead.")
    per_mb = _require(overhead, "per_microbatch_ms", (int, float), source, where + "overhead.")
    if per_layer < 0 or per_mb < 0:
        raise _fail(source, f"{where}overhead must be >= 0 ms")
    attn = _require(d, "attention", Mapping, source, where)
    linear = _require(d, "linear", Mapping, source, where)
    head = _require(d, "head", Mapping, source, where)

    def curve(cls, block: Mapping, xkey: str, name: str):
        xs = _require(block, xkey, list, source, f"{where}{name}.")
        ys = _require(block, "ms", list, source, f"{where}{name}.")
        try:
            return cls(xs, ys, what=f"{where}{name}")
        except (ValueError, TypeError) as err:
            raise _fail(source, str(err)) from None

    if not linear:
        raise _fail(source, f"{where}linear has no curves (need 'dense' and/or 'moe')")
    unknown = sorted(set(linear) - {"dense", "moe"})
    if unknown:
        raise _fail(source, f"{where}linear has unknown kinds {unknown}; allowed: dense, moe")
    return ModeCurves(
        attention=curve(AttentionCurve, attn, "lengths", "attention"),
        linear={k: curve(TokenCurve, v, "tokens", f"linear.{k}") for k, v in linear.items()},
        head=curve(TokenCurve, head, "tokens", "head"),
        layer_overhead_ms=float(per_layer),
        microbatch_overhead_ms=float(per_mb),
    )


def _from_document(
    doc: Any, *, source: str, spec: ModelSpec | None, allow_other_shape: bool
) -> CostModel:
    if not isinstance(doc, Mapping):
        raise _fail(source, f"expected a JSON object at top level, got {type(doc).__name__}")
    schema = doc.get("schema")
    if schema is None:
        raise _fail(source, f"missing field 'schema' (expected {SCHEMA!r}): not a cost model file?")
    if schema != SCHEMA:
        raise _fail(
            source,
            f"unsupported schema {schema!r}; this version of costmodel reads {SCHEMA!r} only "
            "(re-run `costmodel calibrate` to write a current file, or upgrade costmodel)",
            fix=None,
        )
    missing = [k for k in _REQUIRED_FIELDS if k not in doc]
    if missing:
        raise _fail(source, f"missing field(s) {missing} (file truncated or hand-edited?)")
    _check_finite(doc, source)
    try:
        file_spec = ModelSpec.from_dict(_require(doc, "spec", Mapping, source, ""))
    except ValueError as err:
        raise _fail(source, f"invalid model spec: {err}") from None
    fingerprint = _require(doc, "spec_fingerprint", str, source, "")
    if fingerprint != file_spec.fingerprint():
        raise _fail(
            source,
            f"spec_fingerprint {fingerprint} does not match its own spec "
            f"({file_spec.fingerprint()}): the file was edited or is corrupt",
        )
    if spec is not None and spec.fingerprint() != file_spec.fingerprint():
        if not allow_other_shape:
            raise _fail(
                source,
                f"made for model {file_spec.name!r} (shape {file_spec.fingerprint()}), not for "
                f"{spec.name!r} (shape {spec.fingerprint()}); calibrate for this model, or pass "
                "allow_other_shape=True (--cost-model-allow-other-shape) to use it anyway",
                fix=None,
            )
        logger.warning(
            "%s: using a cost model made for %s (shape %s) for %s (shape %s); its curves are "
            "those of %s", source, file_spec.name, file_spec.fingerprint(), spec.name,
            spec.fingerprint(), file_spec.name,
        )
    gpu = _require(doc, "gpu", Mapping, source, "")
    gpu_name = _require(gpu, "name", str, source, "gpu.")
    is_estimate = _require(doc, "is_estimate", bool, source, "")
    curves_doc = _require(doc, "curves", Mapping, source, "")
    if not curves_doc:
        raise _fail(source, "'curves' is empty")
    unknown = sorted(set(curves_doc) - set(MODES))
    if unknown:
        raise _fail(source, f"unknown modes {unknown} in 'curves'; allowed: {list(MODES)}")
    curves = {m: _mode_from_dict(curves_doc[m], m, source) for m in MODES if m in curves_doc}
    reference = doc.get("reference_tokens", DEFAULT_REFERENCE_TOKENS)
    if isinstance(reference, bool) or not isinstance(reference, int) or reference < 1:
        raise _fail(source, f"reference_tokens must be a positive integer, got {reference!r}")
    extra = {
        k: doc.get(k)
        for k in ("created", "command", "device", "kernels", "measurements", "residuals",
                  "flops_check", "validation")
    }
    extra["source"] = source
    try:
        return CostModel(
            spec=file_spec,
            gpu=gpu_name,
            gpu_key=gpu.get("key"),
            curves=curves,
            is_estimate=is_estimate,
            provenance=doc.get("provenance") or {},
            reference_tokens=int(reference),
            extra=extra,
        )
    except ValueError as err:
        raise _fail(source, str(err)) from None


# ---- files ------------------------------------------------------------------------------------------
def _reject_constant(name: str) -> float:
    raise ValueError(f"non-finite number {name}")


def read_document(path: str | os.PathLike) -> dict[str, Any]:
    """Parse a cost model file, with errors that say which file and where."""
    p = Path(path)
    text = p.read_text()
    if not text.strip():
        raise _fail(str(p), "file is empty (an interrupted write?)")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as err:
        hint = " (truncated?)" if err.pos >= len(text.rstrip()) - 1 else ""
        raise _fail(
            str(p),
            f"not valid JSON{hint}: {err.msg} at line {err.lineno} column {err.colno} "
            f"(char {err.pos} of {len(text)})",
        ) from None
    except ValueError:  # NaN / Infinity literals: parse them to say where they are
        _check_finite(json.loads(text), str(p))
        raise


def write_json_atomic(path: str | os.PathLike, doc: Mapping[str, Any]) -> Path:
    """Write JSON so that readers see the old file or the whole new one, never a part.

    The text goes to a temp file in the destination folder (same filesystem), is flushed
    and fsynced, then `os.replace`d over `path`. Any failure removes the temp file.
    """
    target = Path(path)
    text = json.dumps(doc, indent=1, allow_nan=False) + "\n"  # serialise before touching disk
    folder = target.parent if str(target.parent) else Path(".")
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return target


_NAME_RE = re.compile(r"^([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)$")


def load_cost_model(
    path_or_name: str | os.PathLike,
    *,
    spec: ModelSpec | None = None,
    allow_other_shape: bool = False,
) -> CostModel:
    """A cost model from a file, or by name: "h200/qwen3-8b" (or "h200" with `spec`).

    A name resolves to the shipped measured profile `costmodel/profiles/<gpu>/<model>.json`
    when one exists, else to the registry estimate for that GPU (`is_estimate=True`).
    A file made for a different model shape than `spec` is an error unless
    `allow_other_shape=True`.
    """
    text = os.fspath(path_or_name)
    p = Path(text)
    if p.is_file():
        doc = read_document(p)
        return CostModel.from_dict(doc, source=str(p), spec=spec, allow_other_shape=allow_other_shape)
    if p.suffix == ".json" or p.is_dir():
        raise FileNotFoundError(f"no cost model file at {text}")
    from costmodel import gpus
    from costmodel.profiles import profile_path

    m = _NAME_RE.match(text.strip())
    if m:
        gpu_name, model_name = m.group(1), m.group(2)
    elif spec is not None and "/" not in text:
        gpu_name, model_name = text.strip(), spec.name
    else:
        raise ValueError(
            f"{text!r} is neither a cost model file nor a name like 'h200/qwen3-8b' "
            f"(GPU key / model preset); known GPUs: {', '.join(gpus.gpu_keys())}"
        )
    try:
        info = gpus.lookup_gpu(gpu_name)
    except ValueError as err:
        raise ValueError(f"{text!r} is not an existing cost model file, and as a name: {err}") from None
    shipped = profile_path(info.key, model_name)
    if shipped is not None:
        doc = read_document(shipped)
        return CostModel.from_dict(
            doc, source=str(shipped), spec=spec, allow_other_shape=allow_other_shape
        )
    if spec is not None and spec.name.lower() == model_name.lower():
        model_spec = spec
    else:
        model_spec = ModelSpec.from_preset(model_name)
        if spec is not None and spec.fingerprint() != model_spec.fingerprint() and not allow_other_shape:
            raise ValueError(
                f"cost model {text!r} is for model {model_spec.name!r} (shape "
                f"{model_spec.fingerprint()}), not {spec.name!r} (shape {spec.fingerprint()}); "
                "pass allow_other_shape=True to use it anyway"
            )
    logger.info("no measured profile for %s/%s; using the registry estimate", info.key, model_name)
    return gpus.estimate_cost_model(model_spec, info)


# ---- helpers ------------------------------------------------------------------------------------------
def _as_lengths(lengths: ArrayLike) -> np.ndarray:
    return as_lengths(lengths, "lengths")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def lengths_summary(lengths: Sequence[int]) -> str:
    L = np.asarray(lengths)
    return f"{L.size} seqs, {int(L.sum())} tokens, max {int(L.max()) if L.size else 0}"
