"""Triton flash attention for packed variable-length sequences: causal, GQA, fwd + bwd.

Structure follows the Triton fused-attention tutorial (tutorials/06-fused-attention.py),
adapted to packed sequences (``cu_seqlens``) and grouped-query attention. This module holds
the launchers and the ``autograd.Function``; the kernels are in `triton_attention_fwd`
(forward) and `triton_attention_bwd` (backward), their launch configs in
`triton_attention_configs`.

- layouts: q/o/do (total, H, D), k/v (total, H_kv, D), any token/head strides with a unit
  stride on the head dim; logsumexp and delta are float32 (H, total). Accumulation is fp32;
  P and dS are cast to the input dtype before their ``tl.dot`` (bf16/fp16 tensor cores;
  fp32 inputs use TF32 on GPU, exact fp32 in the interpreter).
- configs are fixed per head dim: `CONFIGS` lists, per kernel, a first choice for Hopper
  (H100/H200) and fallbacks tried in order when a config does not fit the GPU's shared
  memory/registers; the config that ran is reported by `chosen_configs()`.

Importing this module imports triton (never CUDA); to run on CPU set
``TRITON_INTERPRET=1`` before triton is first imported.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import triton

from costmodel.kernels.double_backward import first_order_backward
from costmodel.kernels.triton_attention_bwd import attn_bwd_dkdv, attn_bwd_dq, attn_bwd_preprocess
from costmodel.kernels.triton_attention_configs import (
    check_configs,
    chosen_configs,
    dkdv_switch,
    kernel_configs,
    launch,
)
from costmodel.kernels.triton_attention_fwd import attn_fwd

__all__ = ["chosen_configs", "flash_attn_varlen", "kernel_configs", "nan_filled_outputs"]

_LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x · log2 e)
_INT32_MAX = 2**31 - 1
_GRID_YZ_MAX = 65535  # CUDA limit on grid dims y and z (heads, sequences)
_PREPROCESS_BLOCK = 64  # rows per program of the delta = rowsum(o · do) kernel


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
    launch("fwd", attn_fwd, grid, args, head_dim, q.dtype, q.device, configs.get("fwd"))
    return o, lse


def _backward(do, q, k, v, o, lse, cu_seqlens, max_seqlen, sm_scale, configs):
    total, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    num_seqs = cu_seqlens.numel() - 1
    do = do.contiguous()  # same layout as o (contiguous), so they share strides
    delta = _empty((num_heads, total), torch.float32, q.device)
    attn_bwd_preprocess[(triton.cdiv(total, _PREPROCESS_BLOCK), num_heads)](
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
    fuse_dq = dkdv_switch(dkdv_cfg, head_dim, "FUSE_DQ")
    split = dkdv_switch(dkdv_cfg, head_dim, "SPLIT_GROUP")
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
    launch(
        "dkdv",
        attn_bwd_dkdv,
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
    launch(
        "dq",
        attn_bwd_dq,
        lambda cfg: (triton.cdiv(max_seqlen, cfg["BLOCK_M"]), num_heads, num_seqs),
        (q, k, v, do, lse, delta, dq, cu_seqlens, *strides, total, group, sm_scale, qk_scale),
        head_dim,
        q.dtype,
        q.device,
        configs.get("dq"),
    )
    return dq, dk, dv


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
    configs = check_configs(configs)
    sm_scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    return _FlashAttnVarlen.apply(q, k, v, cu_seqlens, max_seqlen, sm_scale, configs)
