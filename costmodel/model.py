"""CostModel: fitted cost curves -> predicted milliseconds per micro-batch.

The model (DESIGN.md, "Data flow" 4), per pass `mode` in {"train", "forward"}:

    microbatch_cost(lengths) = overhead + Σ_layers (Σ_i attn(L_i) + linear(Σ_i L_i)) + head(Σ_i L_i)
    overhead = layers × per_layer_ms + per_microbatch_ms

- `attn(L)`, `linear(T)`, `head(T)`: the curves of `costmodel.curves` (what they are and
  how they extrapolate is described there). Sliding-window layers reuse `attn`: past the
  window W every extra query attends to a full window, so attn_W(L) = attn(W) · pairs_W(L)
  / pairs(W) with pairs_W(L) = W(W+1)/2 + (L−W)·W, the exact pair count (see
  costmodel.flops).
- `per_layer_ms`: the part of a layer that is paid per call, not per token or per sequence
  (the attention call's fixed cost, measured by fitting packs of n equal sequences as
  a(L) + n·b(L)); `per_microbatch_ms`: anything else paid once per micro-batch.

`sample_cost(L)` is the marginal cost of one sample in a micro-batch, the per-length curve a
scheduler balances: layers × attn(L) + L × (marginal linear + head cost per token at a
reference micro-batch size, `reference_tokens`, default 8192). The per-token slope is the
secant over [T/2, 3T/2] so that single GEMM steps do not dominate it.

`load_cost_model` finds a model by file path or by name ("h200/qwen3-8b"); the file format
itself is `costmodel.model_file`. Numpy/scipy only.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from costmodel import gpus
from costmodel.beyond_peak import curves_beyond_peak
from costmodel.checks import positive_int
from costmodel.curves import MODES, ModeCurves, TokenCurve
from costmodel.flops import MAX_LENGTH, as_lengths, causal_pairs
from costmodel.model_file import (
    MAX_TENSOR_PARALLEL,
    OTHER_SHAPE_HINT,
    SCHEMA,
    UnknownCostModel,
    from_document,
    read_document,
    utc_timestamp,
    write_json_atomic,
)
from costmodel.profiles import profile_for_shape, profile_path, shipped_profiles
from costmodel.spec import ModelSpec, as_spec, preset_names

if TYPE_CHECKING:
    from costmodel.context_parallel import ContextParallelCost

__all__ = [
    "DEFAULT_REFERENCE_TOKENS", "PARTS", "CostModel", "cached_cost_model", "load_cost_model",
    "separable_microbatch_costs",
]

logger = logging.getLogger(__name__)

DEFAULT_REFERENCE_TOKENS = 8192
# The parts of a micro-batch's cost, as `breakdown` and `microbatch_parts` name them.
PARTS = ("overhead", "attention", "linear", "head")
# Attention is tabulated per integer length up to this (or the longest knot, if longer,
# up to _MAX_TABLE), token costs per whole count from this up to the largest count asked
# (at most _MAX_TABLE); longer lengths and counts are evaluated directly.
_MIN_TABLE = 16384
_MAX_TABLE = 1 << 18


@dataclass
class _Tables:
    """Per-mode precomputation for the vectorised evaluation."""

    attn_table: np.ndarray  # Σ over layers of attention for one sequence of length L, index L
    overhead: float
    # Σ weight × curve(T) over linear_terms for every whole token count T below its size
    # (`token_costs`): a scheduler prices the same fills many times a step, a lookup instead
    # of an interpolation per curve. Built at the first count asked, grown to the largest,
    # from _MIN_TABLE up to _MAX_TABLE.
    token_table: np.ndarray = field(default_factory=lambda: np.zeros(0))
    linear_terms: list[tuple[float, TokenCurve]] = field(default_factory=list)
    per_token_marginal: float = 0.0


def _linear_sum(terms: list[tuple[float, TokenCurve]], tokens: np.ndarray) -> np.ndarray:
    """Σ weight × curve(tokens) over a mode's token-linear terms (layers' parts and head)."""
    out = np.zeros(tokens.shape)
    for weight, curve in terms:
        out += weight * curve(tokens)
    return out


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
        tensor_parallel: int = 1,
        expert_tensor_parallel: int | None = None,
    ):
        spec = as_spec(spec)  # a preset name or config.json path as well
        # The curves time one tensor-parallel rank's shard of `spec` (its layer and head
        # counts, which price a micro-batch, are the model's): checked here, as a shape.
        # Experts are split TP ways unless said otherwise (Megatron's default); a dense
        # model has none to split.
        self.rank_spec = spec.shard(tensor_parallel, expert_tensor_parallel)
        for name, ways in (("tensor_parallel", tensor_parallel),
                           ("expert_tensor_parallel", expert_tensor_parallel or 1)):
            if ways > MAX_TENSOR_PARALLEL:  # what a file may hold: it would not load again
                raise ValueError(f"{name} must be at most {MAX_TENSOR_PARALLEL}, got {ways}")
        expert_tensor_parallel = spec.expert_split(tensor_parallel, expert_tensor_parallel)
        if not curves:
            raise ValueError("a CostModel needs curves for at least one mode")
        bad = sorted(set(curves) - set(MODES))
        if bad:
            raise ValueError(f"unknown modes {bad}; allowed: {list(MODES)}")
        needed = spec.linear_kinds
        for mode, c in curves.items():
            missing = [k for k in needed if k not in c.linear]
            if missing:
                raise ValueError(
                    f"{mode} curves lack the linear curve(s) {missing} that {spec.name} needs "
                    f"({spec.num_dense_layers} dense, {spec.num_moe_layers} MoE layers)"
                )
        reference_tokens = positive_int(reference_tokens, "reference_tokens")
        if reference_tokens > MAX_LENGTH:  # the per-token slope's micro-batch: 10^307 gave NaN
            raise ValueError(f"reference_tokens must be at most {MAX_LENGTH:,}, got "
                             f"{reference_tokens}")
        self.spec = spec
        self.tensor_parallel = int(tensor_parallel)
        self.expert_tensor_parallel = int(expert_tensor_parallel)
        self.gpu = gpu
        self.gpu_key = gpu_key
        self.curves = dict(curves)
        self.is_estimate = bool(is_estimate)
        self.provenance = dict(provenance or {})
        self.reference_tokens = int(reference_tokens)
        self.extra: dict[str, Any] = dict(extra or {})
        # Shape keys (`ModelSpec.shape_key`) of other model shapes this model was loaded for with
        # allow_other_shape=True: the scheduler accepts it for those, and refuses others.
        self.accepted_shapes: set[str] = set()
        self._tables: dict[str, _Tables] = {}

    def accept_shape_of(self, spec: ModelSpec | None) -> None:
        """Accept ``spec``'s shape too: the caller loaded this model for it on purpose
        (``allow_other_shape=True``), so a scheduler given both balances by it."""
        if spec is not None and spec.shape_key() != self.spec.shape_key():
            self.accepted_shapes.add(spec.shape_key())

    # ---- introspection --------------------------------------------------------------------
    @property
    def modes(self) -> list[str]:
        return [m for m in MODES if m in self.curves]

    @property
    def label(self) -> str:
        # A synthetic-timer or CPU dry-run file is no measurement, whatever GPU it names.
        kind = "ESTIMATE" if self.is_estimate else str(self.provenance.get("kind") or "measured")
        correction = self.provenance.get("correction")
        if isinstance(correction, Mapping) and correction.get("scales"):
            kind += ", corrected"  # by runs of the whole stack (`costmodel correct`)
        return f"{self.spec.name}{self.parallel_label} on {self.gpu} ({kind})"

    @property
    def parallel_label(self) -> str:
        """For one rank's shard, ' at TP 4' (and ', experts TP 1' where they split
        otherwise); '' for one GPU's whole model."""
        tp, etp = self.tensor_parallel, self.expert_tensor_parallel
        experts = f", experts TP {etp}" if etp != tp else ""
        return f" at TP {tp}{experts}" if (tp, etp) != (1, 1) else ""

    def __repr__(self) -> str:
        return f"CostModel({self.label}, modes={self.modes})"

    def validation_summary(self, mode: str = "train") -> str | None:
        """One line of what `costmodel validate` measured for `mode` (None if never run):
        the mean absolute error on micro-batches of >= 1k tokens and on all of them."""
        validation = self.extra.get("validation") or {}
        try:
            block = validation.get("modes", {}).get(mode)
            if not block:
                return None
            summary = block.get("summary", {})
            parts = [f"{summary[split]['cost_model']['mape']:.1%} on {name}"
                     for split, name in ((">=1024", ">= 1k tokens"), ("all", "all sizes"))
                     if split in summary and "cost_model" in summary[split]]
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            # Informational, as in `costmodel report`: named and skipped, never fatal.
            logger.warning("%s: its validation block is malformed, not shown (%s: %s)",
                           self.label, type(err).__name__, err)
            return None
        if not parts:
            return None
        count = validation.get("count", "?")
        return f"validated ({mode}, {count} micro-batches): mean error " + ", ".join(parts)

    def _mode(self, mode: str) -> ModeCurves:
        if not isinstance(mode, str) or mode not in self.curves:
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
            # Past the window, attention grows with the windowed pair count (flops.causal_pairs).
            w = spec.sliding_window
            L = np.asarray(lengths, dtype=np.float64)
            scale = causal_pairs(L, window=w) / causal_pairs([w])[0]
            windowed = c.attention(np.minimum(L, w)) * np.where(w < L, scale, 1.0)
            out = out + n_sw * windowed
        return out

    def _tables_for(self, mode: str) -> _Tables:
        c = self._mode(mode)  # first: a mode that is no key (a list) is a ValueError here
        tables = self._tables.get(mode)
        if tables is not None:
            return tables
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
        return separable_microbatch_costs(self, *checked_csr(lengths, offsets), mode)

    # The three parts of a non-empty micro-batch's cost: fixed_cost + Σ sequence_costs(Lᵢ)
    # + token_costs(Σ Lᵢ). The scheduler's local search uses them to price a move exactly
    # without re-evaluating whole micro-batches.
    def fixed_cost(self, mode: str = "train") -> float:
        """Per micro-batch overhead (ms): every layer's fixed cost plus the micro-batch's."""
        return float(self._tables_for(mode).overhead)

    def sequence_costs(self, lengths: ArrayLike, mode: str = "train") -> np.ndarray:
        """Attention time (ms, all layers) of each sequence, wherever it is packed."""
        return self._attn_lookup(mode, _as_lengths(lengths))

    def token_costs(self, tokens: ArrayLike, mode: str = "train") -> np.ndarray:
        """Token-linear time (ms: every layer's projections and MLP, plus the head) of
        micro-batches of `tokens` tokens in all."""
        t = self._tables_for(mode)
        tokens = np.asarray(tokens, dtype=np.float64)
        if not tokens.size:
            return np.zeros(tokens.shape)
        least, most = float(tokens.min()), float(tokens.max())  # NaN in both if any
        if not 0 <= least <= most < math.inf:  # a curve read below 0 as its floor
            valid = (tokens >= 0) & (tokens < np.inf)
            bad = float(tokens[~valid][0])
            raise ValueError(f"token counts must be finite and >= 0, got {bad!r}")
        if t.token_table.size <= most <= _MAX_TABLE:
            size = min(_MAX_TABLE, max(_MIN_TABLE, 1 << math.ceil(math.log2(most + 1))))
            t.token_table = _linear_sum(t.linear_terms, np.arange(size + 1.0))
        # Whole counts in the table are looked up (the same numbers: the table is this sum at
        # each count). Where any is not (fractions under context parallelism, past the
        # table), all are evaluated: picking the rest out and back in, and the checks for
        # them, cost more than the lookup saved (1.8x the curves' time for counts / 2 at a
        # 16k cap, where half are fractions).
        table = t.token_table
        if most < table.size:
            whole = tokens.astype(np.int64)
            if (whole == tokens).all():
                # asarray: indexing with a 0-d array gives a numpy scalar, not an array
                return np.asarray(table[whole])
        return _linear_sum(t.linear_terms, tokens)

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
        one = self.microbatch_parts(L, np.array([0, L.size]), mode)
        parts = {k: float(v[0]) for k, v in one.items()}
        parts["total"] = sum(parts.values())
        return parts

    def microbatch_parts(
        self, lengths: ArrayLike, offsets: ArrayLike, mode: str = "train"
    ) -> dict[str, np.ndarray]:
        """The parts of `microbatch_costs` (CSR micro-batches, as there), one array each:
        overhead (fixed costs), attention (Σ over sequences and layers), linear (every
        layer's projections and MLP) and head (ms). An empty micro-batch's parts are 0."""
        L, off = checked_csr(lengths, offsets)
        c = self._mode(mode)
        attention, tokens = csr_sums(lambda seq: self._attn_lookup(mode, seq), L, off)
        nonempty = tokens > 0
        linear = np.zeros(tokens.size)
        for weight, curve in self._tables_for(mode).linear_terms[:-1]:  # the last is the head
            linear += weight * curve(tokens)
        return {
            "overhead": np.where(nonempty, self.fixed_cost(mode), 0.0),
            "attention": attention,
            "linear": np.where(nonempty, linear, 0.0),
            "head": np.where(nonempty, c.head(tokens), 0.0),
        }

    def for_context_parallel(self, size: int) -> CostModel | ContextParallelCost:
        """This model as one rank of a `size`-way context-parallel group prices a micro-batch
        (`costmodel.context_parallel`): what the scheduler balances when each micro-batch is
        split over `size` GPUs. Itself at size 1."""
        size = positive_int(size, "context-parallel size")
        if size == 1:
            return self
        from costmodel.context_parallel import ContextParallelCost

        return ContextParallelCost(self, size)

    def stack_cost(
        self, lengths: ArrayLike, mode: str = "train", *, num_layers: int, moe: bool = False,
        head: bool = True, microbatch_overhead: bool = False,
    ) -> float:
        """Predicted time of `num_layers` identical layers (+ the head): what `validate` runs."""
        return sum(self.stack_parts(lengths, mode, num_layers=num_layers, moe=moe, head=head,
                                    microbatch_overhead=microbatch_overhead).values())

    def stack_parts(
        self, lengths: ArrayLike, mode: str = "train", *, num_layers: int, moe: bool = False,
        head: bool = True, microbatch_overhead: bool = False,
    ) -> dict[str, float]:
        """The parts of `stack_cost`, as `breakdown` names them (ms)."""
        num_layers = positive_int(num_layers, "num_layers")
        L = _as_lengths(lengths)
        if L.size == 0:
            return dict.fromkeys(PARTS, 0.0)
        c = self._mode(mode)
        kind = "moe" if moe else "dense"
        if kind not in c.linear:
            raise ValueError(f"this cost model has no {kind} linear curve; it has {list(c.linear)}")
        tokens = float(L.sum())
        return {
            "overhead": num_layers * c.layer_overhead_ms
            + (c.microbatch_overhead_ms if microbatch_overhead else 0.0),
            "attention": num_layers * float(c.attention(L.astype(np.float64)).sum()),
            "linear": num_layers * float(c.linear[kind](tokens)),
            "head": float(c.head(tokens)) if head else 0.0,
        }

    # ---- serialisation -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The cost model file's document (`save` writes it; `from_dict` reads it back)."""
        doc: dict[str, Any] = {
            "schema": SCHEMA,
            "created": self.extra.get("created") or utc_timestamp(),
            "command": self.extra.get("command"),
            "is_estimate": self.is_estimate,
            "gpu": {"key": self.gpu_key, "name": self.gpu},
            "device": self.extra.get("device"),
            "spec": self.spec.to_dict(),
            "spec_fingerprint": self.spec.fingerprint(),
            "tensor_parallel": self.tensor_parallel,
            "expert_tensor_parallel": self.expert_tensor_parallel,
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
        return from_document(cls, doc, source=source, spec=spec, allow_other_shape=allow_other_shape)


# ---- by path or name ---------------------------------------------------------------------
_NAME_RE = re.compile(r"^([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+)$")
_SHARD_RE = re.compile(r"^(.+)-tp([0-9]{1,4})(?:-etp([0-9]{1,4}))?$", re.IGNORECASE)
_NOT_A_FILE = "is not an existing cost model file, and as a name (GPU key / model preset): "


def _shard_sizes(name: str) -> tuple[str, int, int | None] | None:
    """(model, TP, expert TP or None) of a shard's name ("qwen3-32b-tp4-etp1"), or None."""
    shard = _SHARD_RE.match(name)
    if not shard:
        return None
    etp = shard.group(3)
    return shard.group(1), int(shard.group(2)), None if etp is None else int(etp)


def _canonical_shard_name(name: str, spec: ModelSpec | None) -> str:
    """`name` ("qwen3-8b-tp2-etp2") as a shipped profile of that shard is named
    ("qwen3-8b-tp2"): the model alone at TP 1 with whole experts, no leading zeros, no
    expert TP where it equals TP or the model is dense. `name` unchanged when it names no
    shard, or sizes that no shard has (0 is refused later, with the estimate)."""
    sizes = _shard_sizes(name)
    if sizes is None:
        return name
    base, tp, asked_etp = sizes
    etp = tp if asked_etp is None else asked_etp
    if tp < 1 or etp < 1:
        return name
    try:
        whole = spec if spec is not None and spec.name.lower() == base.lower() else (
            ModelSpec.from_preset(base))
    except ValueError:
        whole = None  # an unknown model: said with the estimate's lookup
    if whole is not None:
        etp = whole.expert_split(tp, etp)
    if (tp, etp) == (1, 1):
        return base
    return f"{base}-tp{tp}" + (f"-etp{etp}" if etp != tp else "")


def checked_csr(lengths: ArrayLike, offsets: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Micro-batches laid out CSR-style (see `CostModel.microbatch_costs`) as int64 arrays;
    ValueError for lengths below 1 or offsets that do not slice them."""
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
    return L, off


def separable_microbatch_costs(
    parts: Any, lengths: np.ndarray, offsets: np.ndarray, mode: str = "train"
) -> np.ndarray:
    """CSR micro-batch costs of anything with the three parts of a separable cost
    (`fixed_cost`, `sequence_costs`, `token_costs`, each taking `mode`): fixed + Σ sequence
    costs + token cost of the micro-batch's total; an empty micro-batch costs 0. Inputs
    already checked (int64 lengths >= 1, valid offsets)."""
    attn_sum, tokens = csr_sums(lambda seq: parts.sequence_costs(seq, mode), lengths, offsets)
    cost = parts.fixed_cost(mode) + attn_sum + parts.token_costs(tokens, mode)
    return np.where(tokens > 0, cost, 0.0)


def csr_sums(
    sequence_costs: Callable[[np.ndarray], np.ndarray], lengths: np.ndarray, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per CSR micro-batch (inputs already checked): the sum of its sequences'
    `sequence_costs` (0 when empty) and its token count (float64)."""
    # Each micro-batch summed on its own (a difference of running sums over all of them
    # would carry the rounding of every micro-batch before it: 2e-5 relative after a 2^31
    # token sample). reduceat sums up to the next start: empty micro-batches are skipped.
    sizes = np.diff(offsets)
    nonempty = sizes > 0
    seq_sum = np.zeros(sizes.size)
    if nonempty.any():
        seq = sequence_costs(lengths[: offsets[-1]])
        seq_sum[nonempty] = np.add.reduceat(seq, offsets[:-1][nonempty])
    tok_cum = np.concatenate(([0], np.cumsum(lengths)))  # int64: exact
    return seq_sum, (tok_cum[offsets[1:]] - tok_cum[offsets[:-1]]).astype(np.float64)


def _not_a_name(text: str, why: str) -> UnknownCostModel:
    """``text`` is no file, nor a name of a cost model (``why``), or just a model preset."""
    measured = f"; measured profiles shipped: {', '.join(shipped_profiles()) or 'none'}"
    if text.strip().lower() in preset_names():  # the model alone: which GPU is not said
        return UnknownCostModel(
            f"{text!r} is a model preset, not a cost model: name one as GPU/MODEL, e.g. "
            f"'h200/{text.strip().lower()}' (known GPUs: {', '.join(gpus.gpu_keys())}; any "
            f"other than a measured profile's gives the registry estimate){measured}"
        )
    return UnknownCostModel(f"{text!r} {why}{measured}")


def load_cost_model(
    path_or_name: str | os.PathLike,
    *,
    spec: ModelSpec | None = None,
    allow_other_shape: bool = False,
) -> CostModel:
    """A cost model from a file, or by name: "h200/qwen3-8b" (or "h200" with `spec`).

    A name resolves to the shipped measured profile `costmodel/profiles/<gpu>/<model>.json`
    when one exists, else to the registry estimate for that GPU (`is_estimate=True`). A GPU
    alone takes that GPU's shipped profile of `spec`'s shape, whatever `spec` is called.
    A file made for a different model shape than `spec` is an error unless
    `allow_other_shape=True`.
    """
    if spec is not None:
        spec = as_spec(spec)
    if not isinstance(path_or_name, (str, os.PathLike)):
        raise ValueError(f"a cost model is a file path or a name like 'h200/qwen3-8b', got "
                         f"{path_or_name!r:.60}")
    text = os.fspath(path_or_name)
    if not text.strip():  # Path("") is the current folder: "'' is a folder" misled
        raise UnknownCostModel(f"the cost model is empty ({text!r}): give a cost model file or "
                               "a name like 'h200/qwen3-8b'")
    p = Path(text)
    try:
        is_dir = p.is_dir()
        readable = p.exists() and not is_dir  # a file, or a pipe such as <(cat file.json)
    except OSError as err:  # a name longer than the filesystem takes, say
        shown = repr(text[:60]) + ("..." if len(text) > 60 else "")
        raise ValueError(f"{shown}: no cost model file can be there ({err.strerror}); give "
                         "a file path or a name like 'h200/qwen3-8b'") from None
    if readable:
        return _from_file(p, spec, allow_other_shape)
    if is_dir:  # a calibration's output folder, say
        inside = sorted(q.name for q in p.glob("*.json"))
        raise FileNotFoundError(f"{text} is a folder, not a cost model file" + (
            f": give the file in it, e.g. {p / inside[0]}" if inside else ""))
    if p.suffix == ".json":
        raise FileNotFoundError(f"no cost model file at {text}")
    m = _NAME_RE.match(text.strip())
    if m:
        gpu_name, model_name = m.group(1), m.group(2)
    elif spec is not None and "/" not in text:
        gpu_name, model_name = text.strip(), spec.name
    else:
        raise _not_a_name(text, "is neither a cost model file nor a name like 'h200/qwen3-8b' "
                          f"(GPU key / model preset); known GPUs: {', '.join(gpus.gpu_keys())}")
    try:
        info = gpus.lookup_gpu(gpu_name)
    except ValueError as err:
        raise _not_a_name(text, _NOT_A_FILE + str(err)) from None
    if not m:  # a GPU alone: its profile of the spec's shape, whatever the model is called
        assert spec is not None  # a GPU alone is taken as a name only with a spec (above)
        shipped = profile_for_shape(info.key, spec.shape_key())
    else:
        shipped = profile_path(info.key, model_name)
        if shipped is None and not (spec is not None and spec.name.lower() == model_name.lower()):
            # "qwen3-8b-tp1", "-tp02", "-tp2-etp2": the shipped file's own name
            # (`<model>`, `<model>-tp<N>`, `<model>-tp<N>-etp<M>`), as adopt_gpu_results names it
            model_name = _canonical_shard_name(model_name, spec)
            shipped = profile_path(info.key, model_name)
        if shipped is None and spec is not None and spec.name.lower() == model_name.lower():
            shipped = profile_for_shape(info.key, spec.shape_key())  # a config.json's own name
    if shipped is not None:
        return _from_file(shipped, spec, allow_other_shape)
    # "qwen3-32b-tp4" (-etp1): one rank's shard, as shipped profiles of shards are named
    shard = _shard_sizes(model_name) if m else None
    if shard:
        model_name = shard[0]
    if spec is not None and spec.name.lower() == model_name.lower():
        model_spec = spec
    else:
        try:
            model_spec = ModelSpec.from_preset(model_name)
        except ValueError as err:  # "h200/qwen3-8bb": a typo in the model part of the name
            raise _not_a_name(text, _NOT_A_FILE + str(err)) from None
        if spec is not None and spec.shape_key() != model_spec.shape_key() and not allow_other_shape:
            raise ValueError(
                f"cost model {text!r} is for model {model_spec.name!r} (shape "
                f"{model_spec.fingerprint()}), not {spec.name!r} (shape {spec.fingerprint()}); "
                f"{OTHER_SHAPE_HINT}"
            )
    from costmodel.estimate import estimate_cost_model  # here: estimate builds on CostModel

    tp, etp = shard[1:] if shard else (1, None)
    try:
        model = estimate_cost_model(model_spec, info, tensor_parallel=tp,
                                    expert_tensor_parallel=etp)
    except ValueError as err:  # a shard the model does not split into
        raise ValueError(f"cost model {text!r}: {err}") from None
    # A warning: a trainer that named a GPU/model expecting measured curves balances by an
    # estimate otherwise without a word at its usual log level.
    logger.warning("no measured profile for %s/%s; using the registry estimate (peak rates "
                   "times an efficiency curve): run `costmodel calibrate` on that GPU for "
                   "measured curves", info.key, m.group(2) if m else model_name)
    model.accept_shape_of(spec)  # allowed above
    return model


def _from_file(path: Path, spec: ModelSpec | None, allow_other_shape: bool) -> CostModel:
    """A cost model file, validated; curves faster than its GPU can run are refused too (a
    file edited to 1e-9 ms of attention loaded, and schedules balanced it as free)."""
    model = CostModel.from_dict(read_document(path), source=str(path), spec=spec,
                                allow_other_shape=allow_other_shape)
    impossible = curves_beyond_peak(model)
    if impossible:
        raise ValueError(f"cost model {path}: {impossible}; the file is corrupt or was edited: "
                         f"restore it, fit its measurements again (`costmodel calibrate --refit "
                         f"{path} -o FILE`, no GPU needed), or calibrate again")
    return model


def cached_cost_model(
    path_or_name: str | os.PathLike,
    *,
    spec: ModelSpec | str | None = None,
    allow_other_shape: bool = False,
) -> CostModel:
    """`load_cost_model`, read and validated once per file version, for callers that name
    the cost model on every training step (``cost="h200/qwen3-8b"`` in `build_schedule`,
    the slime and verl drop-ins): loading takes ~7 ms, several times the schedule itself at
    a thousand samples. A file rewritten or replaced (another inode, size, mtime or ctime;
    ctime cannot be set back) is read again. Callers share the returned object, so they
    must not modify it."""
    text = os.fspath(path_or_name)
    try:
        st = os.stat(text)
        text = os.path.abspath(text)
        stamp = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    except OSError:  # a name, or a missing file (load_cost_model says which)
        stamp = None
    spec = as_spec(spec) if spec is not None else None
    return _cached_cost_model(text, spec, bool(allow_other_shape), stamp)


@functools.lru_cache(maxsize=8)
def _cached_cost_model(
    text: str, spec: ModelSpec | None, allow_other_shape: bool, stamp: tuple[int, ...] | None
) -> CostModel:
    del stamp  # part of the cache key only
    return load_cost_model(text, spec=spec, allow_other_shape=allow_other_shape)


def _as_lengths(lengths: ArrayLike) -> np.ndarray:
    return as_lengths(lengths, "lengths")

