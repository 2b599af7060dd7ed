"""Exact analytic matmul FLOPs of a decoder-only transformer over packed sequences.

Conventions (DESIGN.md): 2 FLOPs per multiply-add; sequences are independent (packed
with cu_seqlens, no attention across them); causal attention counts exactly
L(L+1)/2 query-key pairs, not the usual L²/2. Only matrix multiplies are counted:
norms, softmax, rotary embeddings, activations, residual adds and embedding lookups
are not matmul FLOPs; their cost shows up in measured time, not here.

Derivation, per token and per layer (h = hidden, nh/nkv = query/kv heads,
d = head dim, f = MLP width):
  1. q, k, v projections: 2·h·nh·d + 2·(2·h·nkv·d). With GQA, k and v are narrower.
  2. output projection: 2·nh·d·h. This is *not* 2·h² when nh·d ≠ h (Qwen3-0.6B/4B/32B).
  3. SwiGLU MLP: gate and up 2·(2·h·f), down 2·f·h, so 6·h·f.
  4. MoE layer: router 2·h·E (counted, as verl does; Megatron leaves it out: ~1% for 128
     experts at h=2048),
     top-k routed experts 6·h·f_e each, shared experts 6·h·f_shared.
  5. MLA (DeepSeek-V3): q down 2·h·r_q and up 2·r_q·nh·(d_nope + d_rope) (or one direct
     projection when r_q = 0), kv down 2·h·(r_kv + d_rope), kv up 2·r_kv·nh·(d_nope + d_v),
     output 2·nh·d_v·h.
Per sequence and layer, attention core: QKᵀ is 2·d_qk and AV is 2·d_v FLOPs per query-key
pair per head: 2·nh·(d_qk + d_v)·pairs(L). A sliding window W caps every query at W keys
(itself included): pairs = W(W+1)/2 + (L−W)·W when L > W.
LM head: 2·h·V per token (tied embeddings change memory, not FLOPs).
Backward is 2 × forward for every matmul (one product for the input gradient, one for the
weight gradient), so training is 3 × forward. A flash-attention backward that recomputes
QKᵀ does 2.5 × the attention-core forward in hardware; that is kernel work, not model
FLOPs, and is left out of `calculate_train_flops`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from costmodel.spec import ModelSpec, as_spec

# Above this, Σ L² could overflow int64, so the exact sums fall back to Python ints.
_INT64_SAFE = 2**62
# The longest sequence accepted: beyond any context window, the most int32 cu_seqlens hold,
# and short enough that L(L+1)/2 stays exact in int64.
MAX_LENGTH = 2**31 - 1

BREAKDOWN_KEYS = (
    "attention_projections",
    "attention_core",
    "dense_mlp",
    "moe_router",
    "moe_experts",
    "moe_shared_experts",
    "lm_head",
)


_BOOLS = frozenset({bool, np.bool_})


def on_host(values: Any, what: str, *, nested: bool = False) -> Any:
    """A torch tensor, even one that requires grad or lives on a GPU, as a CPU tensor numpy
    can read; anything else as it is. A half-precision one is refused (numpy cannot even
    take bfloat16, and neither holds every length), as are a meta tensor and, unless
    ``nested`` (rows of different lengths expected), a nested one."""
    if hasattr(values, "detach") and hasattr(values, "cpu"):
        # torch's own errors here say "no data" (meta) or "Internal error" (nested)
        kind = "meta" if getattr(values, "is_meta", False) else (
            "nested" if getattr(values, "is_nested", False) and not nested else None)
        if kind:
            raise ValueError(f"{what} is a {kind} tensor, which holds no list of lengths to "
                             "read: give one length per sample as a 1-D tensor or list")
        values = values.detach().cpu()
        if values.is_floating_point() and values.element_size() < 4:
            _refuse_half(what, values.dtype)
    return values


def as_lengths(seqlens: ArrayLike, what: str = "sequence lengths") -> np.ndarray:
    """Validate lengths: a 1-D sequence of integers in 1..`MAX_LENGTH`, returned as int64."""
    seqlens = on_host(seqlens, what)
    # np.asarray reads a masked array's hidden values as lengths: refused, not scheduled.
    if isinstance(seqlens, np.ma.MaskedArray) and np.ma.is_masked(seqlens):
        raise ValueError(f"{what} has masked entries: drop them (or fill them) first")
    try:
        arr = np.asarray(seqlens)
    except ValueError:  # ragged nesting: numpy's "inhomogeneous shape" says little
        raise ValueError(f"{what} must be a flat list of integers, got nested lists of "
                         "different lengths") from None
    if isinstance(seqlens, (list, tuple)) and not _BOOLS.isdisjoint(map(type, seqlens)):
        # numpy reads [True, 2] as [1, 2]: a flag among lengths is a bug upstream (~1 ms
        # at 65k samples; an array's dtype says it at once, below)
        at = next(i for i, x in enumerate(seqlens) if type(x) in _BOOLS)
        raise ValueError(f"{what} must be integers, got {seqlens[at]!r} at index {at}")
    if arr.ndim == 0 and arr.dtype.kind == "O":  # None, a generator, a dict ...
        raise ValueError(f"{what} must be a list or array of integers, got "
                         f"{type(seqlens).__name__}")
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be a 1-D list of integers, got shape {arr.shape}")
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind == "O" and not isinstance(seqlens, (list, tuple)):
        # An object array holds what a list would (Python ints, whole floats, a stray
        # bool): read as that list, it gets the same checks and the same answer.
        return as_lengths(arr.tolist(), what)
    if arr.dtype.kind == "O" and all(map(_is_int, arr.tolist())):  # Python ints, maybe past int64
        i = next((i for i, x in enumerate(arr.tolist()) if not 1 <= x <= MAX_LENGTH), None)
        if i is not None:
            raise _length_out_of_range(what, arr[i], i)
        arr = arr.astype(np.int64)
    if arr.dtype.kind == "f":
        if arr.dtype.itemsize < 4:
            _refuse_half(what, arr.dtype)
        bad = ~np.isfinite(arr) | (arr != np.floor(arr))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{what} must be whole numbers of tokens, got {arr[i].item()!r} at index {i}")
    elif arr.dtype.kind == "O":  # a list mixing ints with other things: name the first
        # that is no length (a whole float is one, as in a list of floats: [2.0, None] blamed 2.0)
        items = arr.tolist()
        bad = next(((i, x) for i, x in enumerate(items)
                    if not (_is_int(x) or _whole_float(x))), None)
        if bad is None:  # whole floats among ints past int64 ([4.0, 2**70]): the range check
            return as_lengths([int(x) for x in items], what)
        i, x = bad
        raise ValueError(f"{what} must be integers, got {x!r:.40} ({type(x).__name__}) at "
                         f"index {i}")
    elif arr.dtype.kind not in "iu":
        raise ValueError(f"{what} must be integers, got dtype {arr.dtype}")
    bad = (arr < 1) | (arr > MAX_LENGTH)  # before the int64 cast, which would wrap around
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _length_out_of_range(what, arr[i].item(), i)
    return arr.astype(np.int64)


def _is_int(x: Any) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _whole_float(x: Any) -> bool:
    return isinstance(x, (float, np.floating)) and bool(np.isfinite(x)) and x == int(x)


def _refuse_half(what: str, dtype: object) -> None:
    raise ValueError(f"{what} must be integers, got {dtype}, which holds whole numbers exactly "
                     "only up to 256 (bfloat16) or 2048 (float16): give an integer type")


def _length_out_of_range(what: str, value: float, i: int) -> ValueError:
    if value < 1:
        return ValueError(f"{what} must be positive (>= 1 token), got {value} at index {i}")
    shown = f"{value:,}" if isinstance(value, int) else f"{value:g}"
    return ValueError(f"{what} must be at most {MAX_LENGTH:,} tokens (2^31 - 1), got {shown} "
                      f"at index {i}")


def causal_pairs(seqlens: ArrayLike, window: int = 0) -> np.ndarray:
    """Query-key pairs of causal attention per sequence: L(L+1)/2, or capped by a window."""
    lengths = as_lengths(seqlens)
    full = lengths * (lengths + 1) // 2
    if window <= 0:
        return full
    capped = window * (window + 1) // 2 + (lengths - window) * window
    return np.where(lengths > window, capped, full)


# ---- per-token and per-pair coefficients of one layer -------------------------------------
def attention_projection_flops_per_token(spec: ModelSpec) -> int:
    """q/k/v/o projections of one layer, per token (items 1, 2 and 5 above)."""
    h, nh = spec.hidden_size, spec.num_heads
    if spec.is_mla:
        d_qk, d_v = spec.qk_head_dim, spec.v_head_dim
        if spec.q_lora_rank:
            q = 2 * h * spec.q_lora_rank + 2 * spec.q_lora_rank * nh * d_qk
        else:
            q = 2 * h * nh * d_qk
        kv_down = 2 * h * (spec.kv_lora_rank + spec.qk_rope_head_dim)
        kv_up = 2 * spec.kv_lora_rank * nh * (spec.qk_nope_head_dim + d_v)
        return q + kv_down + kv_up + 2 * nh * d_v * h
    d = spec.head_dim
    return 2 * h * nh * d + 2 * (2 * h * spec.num_kv_heads * d) + 2 * nh * d * h


def attention_flops_per_pair(spec: ModelSpec) -> int:
    """QKᵀ and AV of one layer, per causal query-key pair, all heads."""
    return 2 * spec.num_heads * (spec.qk_head_dim + spec.value_head_dim)


def mlp_flops_per_token(spec: ModelSpec, *, moe: bool) -> dict[str, int]:
    """The MLP part of one layer per token, by component (items 3 and 4 above)."""
    h = spec.hidden_size
    if not moe:
        return {"dense_mlp": 6 * h * spec.intermediate_size}
    return {
        "moe_router": 2 * h * spec.num_experts,
        "moe_experts": spec.num_experts_per_tok * 6 * h * spec.moe_intermediate_size,
        "moe_shared_experts": 6 * h * spec.shared_expert_intermediate_size,
    }


def layer_linear_flops(tokens: ArrayLike, spec: ModelSpec, *, moe: bool) -> np.ndarray:
    """Token-linear FLOPs (projections + MLP) of one layer for each token count."""
    per_token = attention_projection_flops_per_token(spec) + sum(
        mlp_flops_per_token(spec, moe=moe).values()
    )
    return np.asarray(tokens, dtype=np.float64) * per_token


def attention_core_flops(seqlens: ArrayLike, spec: ModelSpec, *, window: int = 0) -> np.ndarray:
    """Attention-core forward FLOPs of one layer, per sequence (float64)."""
    return causal_pairs(seqlens, window).astype(np.float64) * attention_flops_per_pair(spec)


def lm_head_flops_per_token(spec: ModelSpec) -> int:
    return 2 * spec.hidden_size * spec.vocab_size


def part_flops(part: str, sizes: ArrayLike, spec: ModelSpec, *, moe: bool = False) -> np.ndarray:
    """Forward matmul FLOPs of a part a cost model times, at each size (float64): "attention"
    one sequence of each length in one layer, "linear" one layer's token-linear part at each
    token count (``moe``: a MoE layer's), "head" the LM head at each token count."""
    if part == "attention":
        return attention_core_flops(np.asarray(sizes, dtype=np.int64), spec)
    if part == "linear":
        return layer_linear_flops(sizes, spec, moe=moe)
    if part == "head":
        return np.asarray(sizes, dtype=np.float64) * float(lm_head_flops_per_token(spec))
    raise ValueError(f"no FLOPs count for part {part!r}; parts: attention, linear, head")


# ---- totals ------------------------------------------------------------------------------
def _exact_sum(values: np.ndarray, bound: int) -> int:
    if values.size == 0:
        return 0
    if bound * values.size < _INT64_SAFE:
        return int(values.sum(dtype=np.int64))
    return int(values.astype(object).sum())


def flops_breakdown(seqlens: ArrayLike, spec: ModelSpec) -> dict[str, int]:
    """Forward matmul FLOPs summed over sequences, by component, summed over layers.
    `spec`: a ModelSpec, or a preset name / config.json path (as everywhere)."""
    spec = as_spec(spec)
    lengths = as_lengths(seqlens)
    max_len = int(lengths.max()) if lengths.size else 0
    tokens = _exact_sum(lengths, max_len)
    pair_bound = max_len * (max_len + 1) // 2
    n_window = spec.sliding_window_layers
    full_pairs = _exact_sum(causal_pairs(lengths), pair_bound)
    window_pairs = (
        _exact_sum(causal_pairs(lengths, spec.sliding_window), pair_bound) if n_window else 0
    )
    n_moe = spec.num_moe_layers
    n_dense = spec.num_layers - n_moe
    out = dict.fromkeys(BREAKDOWN_KEYS, 0)
    out["attention_projections"] = spec.num_layers * tokens * attention_projection_flops_per_token(spec)
    out["attention_core"] = attention_flops_per_pair(spec) * (
        (spec.num_layers - n_window) * full_pairs + n_window * window_pairs
    )
    for kind, count in mlp_flops_per_token(spec, moe=False).items():
        out[kind] += n_dense * tokens * count
    if n_moe:
        for kind, count in mlp_flops_per_token(spec, moe=True).items():
            out[kind] += n_moe * tokens * count
    out["lm_head"] = tokens * lm_head_flops_per_token(spec)
    return out


def calculate_fwd_flops(seqlens: ArrayLike, spec: ModelSpec) -> int:
    """Exact forward matmul FLOPs of `spec` over independent sequences of these lengths.

    Counts q/k/v/o projections with the true head dim, causal attention over exactly
    L(L+1)/2 query-key pairs (QKᵀ and AV; capped on sliding-window layers), SwiGLU MLPs,
    MoE router + top-k routed experts + shared experts on MoE layers, MLA projections and
    the LM head, at 2 FLOPs per multiply-add. Norms, softmax, rotary embeddings and
    activations are not matmul FLOPs and are not counted.
    """
    return sum(flops_breakdown(seqlens, spec).values())


def calculate_train_flops(seqlens: ArrayLike, spec: ModelSpec) -> int:
    """Forward + backward model FLOPs: 3 × forward (backward is 2 × forward per matmul)."""
    return 3 * calculate_fwd_flops(seqlens, spec)


def pass_factor(mode: str) -> float:
    """A pass's FLOPs in forwards: 3 for "train" (forward + backward), 1 for "forward"."""
    return 3.0 if mode == "train" else 1.0


def sequence_fwd_flops(seqlens: ArrayLike, spec: ModelSpec) -> np.ndarray:
    """Forward FLOPs of each sequence alone, vectorised (float64: exact below 2**53)."""
    spec = as_spec(spec)
    lengths = as_lengths(seqlens)
    per_token = (
        spec.num_layers * attention_projection_flops_per_token(spec)
        + spec.num_dense_layers * sum(mlp_flops_per_token(spec, moe=False).values())
        + spec.num_moe_layers * sum(mlp_flops_per_token(spec, moe=True).values())
        + lm_head_flops_per_token(spec)
    )
    n_window = spec.sliding_window_layers
    core = attention_core_flops(lengths, spec) * (spec.num_layers - n_window)
    if n_window:
        core += attention_core_flops(lengths, spec, window=spec.sliding_window) * n_window
    return lengths.astype(np.float64) * per_token + core
