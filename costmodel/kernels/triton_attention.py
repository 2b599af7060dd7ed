"""Triton flash attention for packed variable-length sequences: causal, GQA, fwd + bwd.

Structure follows the Triton fused-attention tutorial (tutorials/06-fused-attention.py),
adapted to packed sequences (``cu_seqlens``) and grouped-query attention:

- forward: grid (query block, query head, sequence); a program whose block starts past its
  sequence's end exits at once. Each program runs an *off-band* stage over the key blocks
  strictly below the diagonal (no mask, no bounds checks: those keys are all inside the
  sequence) and an *on-band* stage over the diagonal block (causal mask + key bound).
  Key blocks above the diagonal are never visited (loop bounds), so causal attention costs
  ~half of full attention. Online softmax in base 2: ``qk_scale = sm_scale · log2(e)`` is
  folded into the scores so the kernel calls ``exp2``; the logsumexp (base 2) is saved for
  the backward pass.
- backward: a preprocess kernel for ``delta = rowsum(o · do)``, then one kernel per K/V
  block computing dk, dv (it loops over the query blocks at and below the diagonal, and for
  GQA over the query heads of the group inside the kernel: no atomics, no repeated KV) and
  one kernel per query block computing dq (loops over the key blocks at and left of the
  diagonal). Scores and probabilities are recomputed from q, k and the saved logsumexp.
  A dk/dv config with ``FUSE_DQ=1`` instead adds each block's dS·K to an fp32 dq buffer
  with atomics inside the dk/dv kernel (no dq kernel: 5 matmuls per block pair instead of
  7, as flash-attention 2); one with ``SPLIT_GROUP=1`` runs a dk/dv program per query head
  (no loop over the group, far fewer registers), each writing its own rows of
  per-query-head dk/dv buffers that the launcher sums over the group (as flash-attention 2
  does for GQA); `bench_attention.py --tune-first` measures them all.
- layouts: q/o/do (total, H, D), k/v (total, H_kv, D), any token/head strides with a unit
  stride on the head dim; logsumexp and delta are float32 (H, total). Accumulation is fp32;
  P and dS are cast to the input dtype before their ``tl.dot`` (bf16/fp16 tensor cores;
  fp32 inputs use TF32 on GPU, exact fp32 in the interpreter).

Configs are fixed per head dim (no autotune keyed on the sequence length: a calibration
sweep over many lengths would re-tune at each one). `_CONFIGS` lists, per kernel, a first
choice for Hopper (H100/H200) and fallbacks tried in order when a config does not fit the
GPU's shared memory/registers; the config that ran is reported by `chosen_configs()`.

Importing this module imports triton (never CUDA); to run on CPU set
``TRITON_INTERPRET=1`` before triton is first imported.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator

import torch
import triton
import triton.language as tl

from costmodel.kernels.double_backward import first_order_backward

try:  # triton >= 2.1 (checked against 3.6 and 3.9)
    from triton.runtime.errors import OutOfResources
except ImportError:  # older layouts re-export it from triton.runtime
    from triton.runtime import OutOfResources

__all__ = ["chosen_configs", "flash_attn_varlen", "kernel_configs"]

logger = logging.getLogger(__name__)

_LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x · log2 e)
_INT32_MAX = 2**31 - 1
_GRID_YZ_MAX = 65535  # CUDA limit on grid dims y and z (heads, sequences)

# --------------------------------------------------------------------------- configs
# First entry of each list: the choice for Hopper (H100/H200, 227 KB smem per block); later
# entries are smaller fallbacks, tried in order when a config does not fit (OutOfResources;
# e.g. fp32 inputs at d=128 need 256 KB for the first fwd config).
# Chosen without a GPU, from `python benchmarks/bench_attention.py --aot` (compiles every
# config for sm_90a with triton 3.6, bf16, with the divisibility hints the JIT gives
# 16-aligned pointers and strides, and reads the per-thread stack frame, which is mostly
# register spills): none of the first choices spills; the tutorial's dk/dv tile, 32x128
# with 4 warps, spills 816 B at d=128, the same tile with 8 warps 16 B.
# Measured on the H200 (benchmarks/results/bench_attention_h200.json): with these first
# choices the backward takes 6.3-7.0x the forward for L >= 4k (flash attention's FLOPs
# say 2.5x, torch's varlen kernel takes 2.5-2.7x): the dk/dv and dq tiles come first.
# A likely cause, seen in the AOT build (`--aot` prints each build's wgmma widths): the d=128
# dk/dv first choice runs its Sᵀ and dPᵀ dots as m64n16 wgmmas (8 warps over a 64x32 tile),
# n8 across the diagonal; the tuning candidates with 128-row K/V blocks run n32-n64.
# Another: the dk/dv kernel's loop over the GQA group holds every d=128 build at 254-255
# registers, so those larger tiles spill; SPLIT_GROUP=1 (a program per query head) builds
# the first choice's tile in 162 and the 128-row ones (nearly) without spills.
# TO TUNE on the H200: `python benchmarks/bench_attention.py --tune` times the candidates in
# bench_attention.TUNE_CANDIDATES at L=4k and 16k and prints the fastest per kernel;
# `--tune-first` tunes the backward at L=8k, then benchmarks with the winners. A winner goes
# first in its list as it is; a FUSE_DQ or SPLIT_GROUP dk/dv one decides for its fallbacks
# (`_dkdv_switch`).
_CONFIGS: dict[str, dict[int, list[dict[str, int]]]] = {
    "fwd": {
        64: [
            dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=3),
            dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2),
        ],
        128: [
            dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=3),
            dict(BLOCK_M=128, BLOCK_N=32, num_warps=8, num_stages=2),
            dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=1),
        ],
    },
    # BLOCK_N: the K/V block a program owns; BLOCK_M: query step below the diagonal;
    # MASK_BLOCK_M: the (smaller) query step across the diagonal block.
    "dkdv": {
        64: [
            dict(BLOCK_M=32, BLOCK_N=128, MASK_BLOCK_M=16, num_warps=8, num_stages=2),
            dict(BLOCK_M=32, BLOCK_N=64, MASK_BLOCK_M=16, num_warps=4, num_stages=1),
        ],
        128: [
            dict(BLOCK_M=32, BLOCK_N=64, MASK_BLOCK_M=16, num_warps=8, num_stages=2),
            dict(BLOCK_M=16, BLOCK_N=64, MASK_BLOCK_M=16, num_warps=4, num_stages=1),
        ],
    },
    # BLOCK_M: the query block a program owns; BLOCK_N: key step left of the diagonal;
    # MASK_BLOCK_N: the key step across the diagonal block.
    "dq": {
        64: [
            dict(BLOCK_M=128, BLOCK_N=32, MASK_BLOCK_N=16, num_warps=8, num_stages=3),
            dict(BLOCK_M=64, BLOCK_N=32, MASK_BLOCK_N=16, num_warps=4, num_stages=1),
        ],
        128: [
            dict(BLOCK_M=64, BLOCK_N=64, MASK_BLOCK_N=16, num_warps=4, num_stages=2),
            dict(BLOCK_M=64, BLOCK_N=16, MASK_BLOCK_N=16, num_warps=4, num_stages=1),
        ],
    },
}
_PREPROCESS_BLOCK = 64

# (kernel, head_dim, dtype, device index) -> index into the config list that last worked.
_chosen: dict[tuple[str, int, str, int], int] = {}


def kernel_configs(head_dim: int) -> dict[str, list[dict[str, int]]]:
    """The config lists (first choice, then fallbacks) of each kernel for `head_dim`."""
    if head_dim not in _CONFIGS["fwd"]:
        raise ValueError(f"head_dim {head_dim} not supported; allowed: {sorted(_CONFIGS['fwd'])}")
    return {name: [dict(c) for c in by_dim[head_dim]] for name, by_dim in _CONFIGS.items()}


def chosen_configs() -> dict[str, dict[str, int]]:
    """The config each kernel ran with so far, keyed "kernel/d<head_dim>/<dtype>/dev<i>";
    a dk/dv fallback with the switches it ran with (the first choice's, `_dkdv_switch`)."""
    out = {}
    for (kernel, d, dtype, dev), i in _chosen.items():
        cfg = dict(_CONFIGS[kernel][d][i])
        if kernel == "dkdv":
            for switch in _DKDV_SWITCHES:
                cfg.pop(switch, None)
                if _dkdv_switch(None, d, switch):
                    cfg[switch] = 1
        out[f"{kernel}/d{d}/{dtype}/dev{dev}"] = cfg
    return out


# Block keys each kernel needs (constexprs of the kernel) and keys it may take besides.
_BLOCK_KEYS = {
    "fwd": ("BLOCK_M", "BLOCK_N"),
    "dkdv": ("BLOCK_M", "BLOCK_N", "MASK_BLOCK_M"),
    "dq": ("BLOCK_M", "BLOCK_N", "MASK_BLOCK_N"),
}
# Switches of the whole backward, set by the dk/dv config that decides (`_dkdv_switch`).
_DKDV_SWITCHES = ("FUSE_DQ", "SPLIT_GROUP")
_OPTIONAL_KEYS = {"fwd": ("num_warps", "num_stages"),
                  "dkdv": ("num_warps", "num_stages", *_DKDV_SWITCHES),
                  "dq": ("num_warps", "num_stages")}


_MIN_BLOCK = 16


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_config(kernel: str, cfg: dict[str, int]) -> None:
    """ValueError naming the kernel and the key for a config the launch would mishandle: a
    missing key was a KeyError, BLOCK_M=0 a ZeroDivisionError, a block that is not a power of
    2 an InterpreterError/compile error inside tl.arange, an unknown key silently dropped."""
    if kernel not in _BLOCK_KEYS:
        raise ValueError(f"configs has an unknown kernel {kernel!r}; kernels: {list(_BLOCK_KEYS)}")
    if not isinstance(cfg, dict):
        raise ValueError(f"{kernel} config must be a dict of ints, got {type(cfg).__name__}")
    allowed = _BLOCK_KEYS[kernel] + _OPTIONAL_KEYS[kernel]
    for key in cfg:
        if key not in allowed:
            raise ValueError(f"{kernel} config has an unknown key {key!r}; allowed: {list(allowed)}")
    for key in _BLOCK_KEYS[kernel]:
        if key not in cfg:
            raise ValueError(f"{kernel} config is missing {key!r}; it needs {list(_BLOCK_KEYS[kernel])}")
        _check_power_of_2(kernel, key, cfg[key])  # tl.arange wants a power of 2
        if cfg[key] < _MIN_BLOCK:  # the interpreter runs 8, a GPU build does not
            raise ValueError(f"{kernel} config key {key!r} must be at least {_MIN_BLOCK} (the "
                             f"tensor-core dots need K >= 16), got {cfg[key]}")
    if "num_warps" in cfg:
        _check_power_of_2(kernel, "num_warps", cfg["num_warps"])
    if "num_stages" in cfg and not (_is_int(cfg["num_stages"]) and cfg["num_stages"] >= 1):
        raise ValueError(f"{kernel} config key 'num_stages' must be an int >= 1, got "
                         f"{cfg['num_stages']!r}")
    for switch in _DKDV_SWITCHES:
        if switch in cfg and cfg[switch] not in (0, 1):
            raise ValueError(f"{kernel} config key {switch!r} must be 0 or 1, got {cfg[switch]!r}")
    if kernel == "fwd" and cfg["BLOCK_M"] % cfg["BLOCK_N"]:
        raise ValueError(f"fwd config needs BLOCK_M % BLOCK_N == 0, got {cfg}")
    if kernel == "dkdv" and cfg["BLOCK_N"] % cfg["MASK_BLOCK_M"]:
        raise ValueError(f"dkdv config needs BLOCK_N % MASK_BLOCK_M == 0, got {cfg}")
    if kernel == "dq" and (cfg["BLOCK_M"] % cfg["BLOCK_N"] or cfg["BLOCK_M"] % cfg["MASK_BLOCK_N"]):
        raise ValueError(
            f"dq config needs BLOCK_M divisible by BLOCK_N and MASK_BLOCK_N, got {cfg}"
        )


def _check_power_of_2(kernel: str, key: str, value) -> None:
    if not (_is_int(value) and value >= 1 and value & (value - 1) == 0):
        raise ValueError(f"{kernel} config key {key!r} must be an int power of 2 (1, 2, 4, ...), "
                         f"got {value!r}")


def _check_configs(configs) -> dict[str, dict[str, int]]:
    """Every override of a ``configs`` argument checked up front (the backward's too, so a
    bad one fails before the forward runs); a copy, so later edits by the caller do not
    change what the backward launches."""
    if configs is None:
        return {}
    if not isinstance(configs, dict):
        raise ValueError(f"configs must be a dict of kernel name -> config dict, got "
                         f"{type(configs).__name__}")
    for kernel, cfg in configs.items():
        _check_config(kernel, cfg)
    return {kernel: dict(cfg) for kernel, cfg in configs.items()}


def _launch_args(config: dict[str, int]) -> tuple[dict[str, int], int, int]:
    """A config split into the kernel's block sizes, num_warps and num_stages. FUSE_DQ is a
    launch argument, not a config key, and so is SPLIT_GROUP: `_dkdv_switch` decides each
    for the whole backward."""
    cfg = dict(config)
    warps, stages = cfg.pop("num_warps", 4), cfg.pop("num_stages", 2)
    for switch in _DKDV_SWITCHES:
        cfg.pop(switch, None)
    return cfg, warps, stages


def _launch(
    kernel_name: str,
    kernel,
    grid_fn,
    args: tuple,
    head_dim: int,
    dtype,
    device,
    override: dict[str, int] | None,
) -> None:
    """Launch `kernel` with the first config that fits; remember which one worked.
    ``override`` was checked by `flash_attn_varlen` (`_check_configs`)."""
    if override is not None:
        cfg, warps, stages = _launch_args(override)
        kernel[grid_fn(cfg)](*args, HEAD_DIM=head_dim, num_warps=warps, num_stages=stages, **cfg)
        return
    configs = _CONFIGS[kernel_name][head_dim]
    dev = device.index if device.type == "cuda" and device.index is not None else 0
    key = (kernel_name, head_dim, str(dtype).removeprefix("torch."), dev)
    start = _chosen.get(key, 0)
    for i in range(start, len(configs)):
        cfg, warps, stages = _launch_args(configs[i])
        try:
            kernel[grid_fn(cfg)](
                *args, HEAD_DIM=head_dim, num_warps=warps, num_stages=stages, **cfg
            )
        except OutOfResources as exc:
            if i + 1 == len(configs):
                raise RuntimeError(
                    f"triton attention {kernel_name} kernel: no config fits this GPU for "
                    f"head_dim={head_dim} ({exc}); smallest tried: {configs[i]}"
                ) from exc
            logger.info(
                "%s config %s does not fit (%s); trying %s",
                kernel_name,
                configs[i],
                exc,
                configs[i + 1],
            )
            continue
        _chosen[key] = i
        return


# --------------------------------------------------------------------------- forward
# Tile loads of the backward kernels. The forward keeps its loads inline: routed through
# these helpers, triton 3.6 spills 24 B/thread more in the d=128 forward (sm_90 AOT build).
@triton.jit
def _load_tile(base, rows, stride, cols, mask):
    """A rows × head_dim tile of one head (row r at base + r·stride); masked rows read 0."""
    return tl.load(base + rows[:, None] * stride + cols[None, :], mask=mask[:, None], other=0.0)


@triton.jit
def _load_tile_t(base, rows, stride, cols, mask):
    """The same tile transposed (head_dim × rows): the Kᵀ and Qᵀ operands of tl.dot."""
    return tl.load(base + rows[None, :] * stride + cols[:, None], mask=mask[None, :], other=0.0)


@triton.jit
def _sequence_block(cu_seqlens, BLOCK: tl.constexpr, HEAVY_LAST: tl.constexpr):
    """(start of this program's sequence as int64, its length, first row of this program's
    block). Grid axis 0 is the block (reversed with HEAVY_LAST), axis 2 the sequence."""
    pid = tl.program_id(0)
    if HEAVY_LAST:
        pid = tl.num_programs(0) - 1 - pid
    seq = tl.program_id(2)
    seq_start = tl.load(cu_seqlens + seq)
    seqlen = tl.load(cu_seqlens + seq + 1) - seq_start
    return seq_start.to(tl.int64), seqlen, pid * BLOCK


@triton.jit
def _fwd_inner(
    acc,
    l_i,
    m_i,
    q,
    k_base,
    v_base,
    stride_kt,
    stride_vt,
    lo,
    hi,
    seqlen,
    qk_scale,
    offs_m,
    offs_n,
    offs_d,
    ON_BAND: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        if ON_BAND:
            kv_mask = cols < seqlen
            k = tl.load(
                k_base + cols[None, :] * stride_kt + offs_d[:, None],
                mask=kv_mask[None, :],
                other=0.0,
            )
        else:  # off-band keys lie below the diagonal, hence inside the sequence
            k = tl.load(k_base + cols[None, :] * stride_kt + offs_d[:, None])
        qk = tl.dot(q, k)
        if ON_BAND:
            # Causal mask. Keys past the sequence end are masked too (col > every valid row).
            # -inf, selected (not added): a future key can neither win the max nor carry a
            # NaN into it. Every row's max stays finite: the first on-band block holds the
            # row's own diagonal key or earlier ones, and off-band blocks come before it.
            qk = tl.where(offs_m[:, None] >= cols[None, :], qk * qk_scale, float("-inf"))
            m_ij = tl.maximum(m_i, tl.max(qk, 1))
            qk = qk - m_ij[:, None]
        else:
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            qk = qk * qk_scale - m_ij[:, None]
        p = tl.math.exp2(qk)
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if ON_BAND:
            v = tl.load(
                v_base + cols[:, None] * stride_vt + offs_d[None, :],
                mask=kv_mask[:, None],
                other=0.0,
            )
        else:
            v = tl.load(v_base + cols[:, None] * stride_vt + offs_d[None, :])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    return acc, l_i, m_i


@triton.jit
def _attn_fwd(
    Q,
    K,
    V,
    Out,
    LSE,
    cu_seqlens,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    total,
    group,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # Heaviest (last) query blocks first: causal work grows with the block index, so
    # launching them early shortens the tail.
    seq_start, seqlen, start_m = _sequence_block(cu_seqlens, BLOCK_M, True)
    if start_m >= seqlen:
        return
    head = tl.program_id(1)
    kv_head = head // group
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_mask = offs_m < seqlen
    q_base = Q + seq_start * stride_qt + head * stride_qh
    k_base = K + seq_start * stride_kt + kv_head * stride_kh
    v_base = V + seq_start * stride_vt + kv_head * stride_vh
    q = tl.load(
        q_base + offs_m[:, None] * stride_qt + offs_d[None, :], mask=row_mask[:, None], other=0.0
    )
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - float("inf")
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # off-band: key blocks [0, start_m), entirely below the diagonal
    acc, l_i, m_i = _fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        stride_kt,
        stride_vt,
        0,
        start_m,
        seqlen,
        qk_scale,
        offs_m,
        offs_n,
        offs_d,
        False,
        BLOCK_N,
    )
    # on-band: the diagonal block, clipped to the sequence end
    hi = tl.minimum(start_m + BLOCK_M, seqlen)
    acc, l_i, m_i = _fwd_inner(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        stride_kt,
        stride_vt,
        start_m,
        hi,
        seqlen,
        qk_scale,
        offs_m,
        offs_n,
        offs_d,
        True,
        BLOCK_N,
    )
    lse = m_i + tl.math.log2(l_i)  # base-2 logsumexp of the scaled scores
    acc = acc / l_i[:, None]
    tl.store(LSE + head * total + seq_start + offs_m, lse, mask=row_mask)
    o_base = Out + seq_start * stride_ot + head * stride_oh
    tl.store(
        o_base + offs_m[:, None] * stride_ot + offs_d[None, :],
        acc.to(Out.dtype.element_ty),
        mask=row_mask[:, None],
    )


# -------------------------------------------------------------------------- backward
@triton.jit
def _bwd_preprocess(
    Out, DO, Delta, stride_ot, stride_oh, total, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr
):
    rows = (tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    head = tl.program_id(1)
    offs_d = tl.arange(0, HEAD_DIM)
    mask = rows < total
    ptrs = rows[:, None] * stride_ot + head * stride_oh + offs_d[None, :]
    o = tl.load(Out + ptrs, mask=mask[:, None], other=0.0).to(tl.float32)
    do = tl.load(DO + ptrs, mask=mask[:, None], other=0.0).to(tl.float32)
    tl.store(Delta + head * total + rows, tl.sum(o * do, 1), mask=mask)


@triton.jit
def _bwd_dkdv_inner(
    dk,
    dv,
    k,
    v,
    q_base,
    do_base,
    lse_base,
    delta_base,
    stride_qt,
    stride_ot,
    lo,
    hi,
    seqlen,
    qk_scale,
    offs_n,
    offs_d,
    dq_base,
    stride_dqt,
    MASK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    FUSE_DQ: tl.constexpr,
):
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        row_mask = offs_m < seqlen
        q_t = _load_tile_t(q_base, offs_m, stride_qt, offs_d, row_mask)
        # rows past the end get lse = +inf, hence p = 0: they contribute nothing
        lse = tl.load(lse_base + offs_m, mask=row_mask, other=float("inf"))
        p_t = tl.math.exp2(tl.dot(k, q_t) * qk_scale - lse[None, :])
        if MASK:
            p_t = tl.where(offs_m[None, :] >= offs_n[:, None], p_t, 0.0)
        do = _load_tile(do_base, offs_m, stride_ot, offs_d, row_mask)
        dv += tl.dot(p_t.to(do.dtype), do)
        delta = tl.load(delta_base + offs_m, mask=row_mask, other=0.0)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = (p_t * (dp_t - delta[None, :])).to(q_t.dtype)
        dk += tl.dot(ds_t, tl.trans(q_t))
        if FUSE_DQ:  # this block's share of dq = dS·K, summed over key blocks by atomics
            dq = tl.dot(tl.trans(ds_t), k)
            ptrs = dq_base + offs_m[:, None] * stride_dqt + offs_d[None, :]
            tl.atomic_add(ptrs, dq, mask=row_mask[:, None], sem="relaxed")
    return dk, dv


@triton.jit
def _bwd_dkdv_head(
    dk,
    dv,
    k,
    v,
    head,
    Q,
    DO,
    LSE,
    Delta,
    DQ,
    seq_start,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_dqt,
    stride_dqh,
    total,
    start_n,
    seqlen,
    qk_scale,
    offs_n,
    offs_d,
    FUSE_DQ: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASK_BLOCK_M: tl.constexpr,
):
    """One query head's share of a K/V block's dk and dv (and, with FUSE_DQ, of its dq)."""
    q_base = Q + seq_start * stride_qt + head * stride_qh
    do_base = DO + seq_start * stride_ot + head * stride_oh
    lse_base = LSE + head * total + seq_start
    delta_base = Delta + head * total + seq_start
    dq_base = DQ + seq_start * stride_dqt + head * stride_dqh
    # queries crossing the diagonal block: masked, finer steps
    diag_hi = tl.minimum(start_n + BLOCK_N, seqlen)
    dk, dv = _bwd_dkdv_inner(
        dk,
        dv,
        k,
        v,
        q_base,
        do_base,
        lse_base,
        delta_base,
        stride_qt,
        stride_ot,
        start_n,
        diag_hi,
        seqlen,
        qk_scale,
        offs_n,
        offs_d,
        dq_base,
        stride_dqt,
        True,
        MASK_BLOCK_M,
        FUSE_DQ,
    )
    # queries entirely below the diagonal: no causal mask
    dk, dv = _bwd_dkdv_inner(
        dk,
        dv,
        k,
        v,
        q_base,
        do_base,
        lse_base,
        delta_base,
        stride_qt,
        stride_ot,
        start_n + BLOCK_N,
        seqlen,
        seqlen,
        qk_scale,
        offs_n,
        offs_d,
        dq_base,
        stride_dqt,
        False,
        BLOCK_M,
        FUSE_DQ,
    )
    return dk, dv


@triton.jit
def _attn_bwd_dkdv(
    Q,
    K,
    V,
    DO,
    LSE,
    Delta,
    DK,
    DV,
    cu_seqlens,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_dkt,
    stride_dkh,
    DQ,
    stride_dqt,
    stride_dqh,
    total,
    group,
    sm_scale,
    qk_scale,
    FUSE_DQ: tl.constexpr,
    SPLIT_GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASK_BLOCK_M: tl.constexpr,
):
    # The first K/V blocks see the most queries: launch them first.
    seq_start, seqlen, start_n = _sequence_block(cu_seqlens, BLOCK_N, False)
    if start_n >= seqlen:
        return
    # Grid axis 1: the query head with SPLIT_GROUP (its dk/dv go to its own rows of
    # per-query-head buffers, summed over the group by the launcher), else the K/V head.
    if SPLIT_GROUP:
        out_head = tl.program_id(1)
        kv_head = out_head // group
    else:
        kv_head = tl.program_id(1)
        out_head = kv_head
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    col_mask = offs_n < seqlen
    k = _load_tile(
        K + seq_start * stride_kt + kv_head * stride_kh, offs_n, stride_kt, offs_d, col_mask
    )
    v = _load_tile(
        V + seq_start * stride_vt + kv_head * stride_vh, offs_n, stride_vt, offs_d, col_mask
    )
    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    if SPLIT_GROUP:
        # One query head per program: no loop over the group around the two query loops,
        # which in an sm_90a build (triton 3.6, d=128, 32x64 tile) takes the kernel from
        # 162 registers to 254.
        dk, dv = _bwd_dkdv_head(dk, dv, k, v, out_head, Q, DO, LSE, Delta, DQ, seq_start,
                                stride_qt, stride_qh, stride_ot, stride_oh, stride_dqt,
                                stride_dqh, total, start_n, seqlen, qk_scale, offs_n, offs_d,
                                FUSE_DQ, BLOCK_M, BLOCK_N, MASK_BLOCK_M)
    else:
        # GQA: the K/V block is shared by `group` query heads; sum their contributions here
        for g in range(0, group):
            dk, dv = _bwd_dkdv_head(dk, dv, k, v, kv_head * group + g, Q, DO, LSE, Delta, DQ,
                                    seq_start, stride_qt, stride_qh, stride_ot, stride_oh,
                                    stride_dqt, stride_dqh, total, start_n, seqlen, qk_scale,
                                    offs_n, offs_d, FUSE_DQ, BLOCK_M, BLOCK_N, MASK_BLOCK_M)
    dk *= sm_scale
    out = (
        seq_start * stride_dkt
        + out_head * stride_dkh
        + offs_n[:, None] * stride_dkt
        + offs_d[None, :]
    )
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=col_mask[:, None])
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=col_mask[:, None])


@triton.jit
def _bwd_dq_inner(
    dq,
    q,
    do,
    lse,
    delta,
    k_base,
    v_base,
    stride_kt,
    stride_vt,
    lo,
    hi,
    seqlen,
    qk_scale,
    offs_m,
    offs_d,
    MASK: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        if MASK:
            col_mask = offs_n < seqlen
            k_t = _load_tile_t(k_base, offs_n, stride_kt, offs_d, col_mask)
            v_t = _load_tile_t(v_base, offs_n, stride_vt, offs_d, col_mask)
        else:  # keys left of the diagonal lie inside the sequence
            k_t = tl.load(k_base + offs_n[None, :] * stride_kt + offs_d[:, None])
            v_t = tl.load(v_base + offs_n[None, :] * stride_vt + offs_d[:, None])
        p = tl.math.exp2(tl.dot(q, k_t) * qk_scale - lse[:, None])
        if MASK:
            p = tl.where(offs_m[:, None] >= offs_n[None, :], p, 0.0)
        dp = tl.dot(do, v_t)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k_t.dtype), tl.trans(k_t))
    return dq


@triton.jit
def _attn_bwd_dq(
    Q,
    K,
    V,
    DO,
    LSE,
    Delta,
    DQ,
    cu_seqlens,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    total,
    group,
    sm_scale,
    qk_scale,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASK_BLOCK_N: tl.constexpr,
):
    seq_start, seqlen, start_m = _sequence_block(cu_seqlens, BLOCK_M, True)
    if start_m >= seqlen:
        return
    head = tl.program_id(1)
    kv_head = head // group
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_mask = offs_m < seqlen
    q = _load_tile(
        Q + seq_start * stride_qt + head * stride_qh, offs_m, stride_qt, offs_d, row_mask
    )
    do = _load_tile(
        DO + seq_start * stride_ot + head * stride_oh, offs_m, stride_ot, offs_d, row_mask
    )
    lse = tl.load(LSE + head * total + seq_start + offs_m, mask=row_mask, other=float("inf"))
    delta = tl.load(Delta + head * total + seq_start + offs_m, mask=row_mask, other=0.0)
    k_base = K + seq_start * stride_kt + kv_head * stride_kh
    v_base = V + seq_start * stride_vt + kv_head * stride_vh
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # keys crossing the diagonal block: masked, finer steps
    diag_hi = tl.minimum(start_m + BLOCK_M, seqlen)
    dq = _bwd_dq_inner(
        dq,
        q,
        do,
        lse,
        delta,
        k_base,
        v_base,
        stride_kt,
        stride_vt,
        start_m,
        diag_hi,
        seqlen,
        qk_scale,
        offs_m,
        offs_d,
        True,
        MASK_BLOCK_N,
    )
    # keys entirely left of the diagonal: no mask
    dq = _bwd_dq_inner(
        dq,
        q,
        do,
        lse,
        delta,
        k_base,
        v_base,
        stride_kt,
        stride_vt,
        0,
        start_m,
        seqlen,
        qk_scale,
        offs_m,
        offs_d,
        False,
        BLOCK_N,
    )
    dq *= sm_scale
    tl.store(
        DQ
        + seq_start * stride_ot
        + head * stride_oh
        + offs_m[:, None] * stride_ot
        + offs_d[None, :],
        dq.to(DQ.dtype.element_ty),
        mask=row_mask[:, None],
    )


# -------------------------------------------------------------------------- launchers
_NAN_FILLS = [0]  # how many `nan_filled_outputs` are active


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Allocate an output buffer (NaN-filled under `nan_filled_outputs`)."""
    if _NAN_FILLS[0]:
        return torch.full(shape, float("nan"), dtype=dtype, device=device)
    return torch.empty(shape, dtype=dtype, device=device)


@contextlib.contextmanager
def nan_filled_outputs() -> Iterator[None]:
    """While active, every buffer the launchers allocate starts NaN, so a row a kernel does
    not write shows as NaN instead of stale memory (which the caching allocator may hand
    back holding a previous run's correct values). For tests and the tuning gate."""
    _NAN_FILLS[0] += 1
    try:
        yield
    finally:
        _NAN_FILLS[0] -= 1


def _unit_last(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _check_launch_limits(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_seqs: int, max_seqlen: int
) -> None:
    if num_seqs > _GRID_YZ_MAX:
        raise ValueError(
            f"{num_seqs} sequences in one pack exceed the launch limit of {_GRID_YZ_MAX} "
            "(CUDA grid dim z); split the micro-batch"
        )
    if q.shape[1] > _GRID_YZ_MAX:
        raise ValueError(f"{q.shape[1]} query heads exceed the launch limit of {_GRID_YZ_MAX}")
    # logsumexp/delta offsets `head * total` are int32 in the kernels.
    if q.shape[1] * q.shape[0] > _INT32_MAX:
        raise ValueError(
            f"{q.shape[1]} heads × {q.shape[0]} tokens = {q.shape[1] * q.shape[0]} exceeds the "
            f"int32 offset limit {_INT32_MAX} of the logsumexp buffer; split the micro-batch"
        )
    # In-sequence offsets are int32 (the sequence base is int64): row · token stride must fit,
    # for the inputs and for the outputs and gradients (dense: token stride heads × dim),
    # and so must head · head stride (a head-major view's head stride is tokens × dim).
    dense = q.shape[1] * q.shape[2]
    for name, token_stride, heads, head_stride in (
        ("q", q.stride(0), q.shape[1], q.stride(1)),
        ("k", k.stride(0), k.shape[1], k.stride(1)),
        ("v", v.stride(0), v.shape[1], v.stride(1)),
        ("the output", dense, q.shape[1], q.shape[2]),
    ):
        span = (max_seqlen + 128) * max(token_stride, 1)
        if span > _INT32_MAX:
            raise ValueError(
                f"max_seqlen={max_seqlen} × {name} token stride {token_stride} = {span} "
                f"exceeds the int32 offset limit {_INT32_MAX}; split the micro-batch"
            )
        if heads * head_stride > _INT32_MAX:
            raise ValueError(
                f"{heads} heads × {name} head stride {head_stride} = {heads * head_stride} "
                f"exceeds the int32 offset limit {_INT32_MAX}; give {name} token-major "
                "(tokens, heads, dim) or split the micro-batch"
            )


def _forward(q, k, v, cu_seqlens, max_seqlen, sm_scale, configs):
    total, num_heads, head_dim = q.shape
    group = num_heads // k.shape[1]
    num_seqs = cu_seqlens.numel() - 1
    o = _empty((total, num_heads, head_dim), q.dtype, q.device)
    lse = _empty((num_heads, total), torch.float32, q.device)
    args = (
        q,
        k,
        v,
        o,
        lse,
        cu_seqlens,
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        o.stride(0),
        o.stride(1),
        total,
        group,
        sm_scale * _LOG2E,
    )
    grid = lambda cfg: (triton.cdiv(max_seqlen, cfg["BLOCK_M"]), num_heads, num_seqs)
    _launch("fwd", _attn_fwd, grid, args, head_dim, q.dtype, q.device, configs.get("fwd"))
    return o, lse


def _backward(do, q, k, v, o, lse, cu_seqlens, max_seqlen, sm_scale, configs):
    total, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    num_seqs = cu_seqlens.numel() - 1
    do = do.contiguous()  # same layout as o (contiguous), so they share strides
    delta = _empty((num_heads, total), torch.float32, q.device)
    _bwd_preprocess[(triton.cdiv(total, _PREPROCESS_BLOCK), num_heads)](
        o,
        do,
        delta,
        o.stride(0),
        o.stride(1),
        total,
        HEAD_DIM=head_dim,
        BLOCK_M=_PREPROCESS_BLOCK,
    )
    # FUSE_DQ (a dkdv config key, 0 by default): the dk/dv kernel also accumulates dq with
    # fp32 atomics (5 matmuls per block pair, as flash-attention 2) instead of a separate
    # dq kernel recomputing P and dP (7).
    # SPLIT_GROUP (also a dkdv key, 0 by default): one dk/dv program per query head instead
    # of per K/V head looping over its group (far fewer registers); with GQA each writes
    # its own rows of per-query-head buffers in k's dtype (as flash-attention 2: group
    # times dk/dv's memory while the backward runs), summed over the group below.
    dkdv_cfg = configs.get("dkdv")
    fuse_dq = _dkdv_switch(dkdv_cfg, head_dim, "FUSE_DQ")
    split = _dkdv_switch(dkdv_cfg, head_dim, "SPLIT_GROUP")
    if fuse_dq:
        dq = torch.zeros((total, num_heads, head_dim), dtype=torch.float32, device=q.device)
    else:
        dq = _empty((total, num_heads, head_dim), q.dtype, q.device)
    if split and group > 1:
        dk = _empty((total, num_heads, head_dim), k.dtype, k.device)
        dv = _empty((total, num_heads, head_dim), k.dtype, k.device)
    else:
        dk = _empty((total, num_kv_heads, head_dim), k.dtype, k.device)
        dv = _empty((total, num_kv_heads, head_dim), k.dtype, k.device)
    strides = (
        q.stride(0),
        q.stride(1),
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        o.stride(0),
        o.stride(1),
    )
    qk_scale = sm_scale * _LOG2E
    _launch(
        "dkdv",
        _attn_bwd_dkdv,
        lambda cfg: (triton.cdiv(max_seqlen, cfg["BLOCK_N"]), num_heads if split else num_kv_heads,
                     num_seqs),
        (
            q,
            k,
            v,
            do,
            lse,
            delta,
            dk,
            dv,
            cu_seqlens,
            *strides,
            dk.stride(0),
            dk.stride(1),
            dq,
            dq.stride(0),
            dq.stride(1),
            total,
            group,
            sm_scale,
            qk_scale,
            fuse_dq,
            split,
        ),
        head_dim,
        q.dtype,
        q.device,
        dkdv_cfg,
    )
    if split and group > 1:
        dk, dv = (t.view(total, num_kv_heads, group, head_dim).sum(2) for t in (dk, dv))
    if fuse_dq:
        return (dq * sm_scale).to(q.dtype), dk, dv
    _launch(
        "dq",
        _attn_bwd_dq,
        lambda cfg: (triton.cdiv(max_seqlen, cfg["BLOCK_M"]), num_heads, num_seqs),
        (q, k, v, do, lse, delta, dq, cu_seqlens, *strides, total, group, sm_scale, qk_scale),
        head_dim,
        q.dtype,
        q.device,
        configs.get("dq"),
    )
    return dq, dk, dv


def _dkdv_switch(override: dict[str, int] | None, head_dim: int, key: str) -> bool:
    """A dk/dv switch of the whole backward (FUSE_DQ: dq by atomics in the dk/dv kernel;
    SPLIT_GROUP: a program per query head): the override's, else the first choice's, for
    its fallbacks too (buffers and the grid are set before the launch finds which config
    fits), so that a tuned config can go first in `_CONFIGS` as it is."""
    cfg = override if override is not None else _CONFIGS["dkdv"][head_dim][0]
    return bool(cfg.get(key, 0))


class _FlashAttnVarlen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, max_seqlen, sm_scale, configs):
        o, lse = _forward(q, k, v, cu_seqlens, max_seqlen, sm_scale, configs)
        ctx.save_for_backward(q, k, v, o, lse, cu_seqlens)
        ctx.max_seqlen, ctx.sm_scale, ctx.configs = max_seqlen, sm_scale, configs
        return o

    @staticmethod
    @first_order_backward("triton attention")
    def backward(ctx, saved, do):
        q, k, v, o, lse, cu_seqlens = saved
        dq, dk, dv = _backward(
            do, q, k, v, o, lse, cu_seqlens, ctx.max_seqlen, ctx.sm_scale, ctx.configs
        )
        return dq, dk, dv, None, None, None, None


def flash_attn_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    *,
    sm_scale: float | None = None,
    configs: dict[str, dict[str, int]] | None = None,
) -> torch.Tensor:
    """Causal GQA attention over packed sequences (differentiable in q, k, v).

    Inputs as in `costmodel.kernels.attention` (validated there; this function only checks
    launch limits and ``configs``). ``configs`` overrides the per-kernel configs, e.g.
    ``{"fwd": {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 2}}`` (tests use
    small blocks to exercise the multi-block paths at tiny lengths).
    """
    q, k, v = _unit_last(q), _unit_last(k), _unit_last(v)
    cu_seqlens = cu_seqlens.contiguous()  # the kernels index it as a dense array
    max_seqlen = int(max_seqlen)
    _check_launch_limits(q, k, v, cu_seqlens.numel() - 1, max_seqlen)
    configs = _check_configs(configs)
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    return _FlashAttnVarlen.apply(q, k, v, cu_seqlens, max_seqlen, sm_scale, configs)
