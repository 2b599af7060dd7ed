"""The backward kernels of the Triton varlen attention (`triton_attention`).

A preprocess kernel for ``delta = rowsum(o · do)``, then one kernel per K/V block computing
dk, dv (it loops over the query blocks at and below the diagonal, and for GQA over the query
heads of the group inside the kernel: no atomics, no repeated KV) and one kernel per query
block computing dq (loops over the key blocks at and left of the diagonal). Scores and
probabilities are recomputed from q, k and the saved logsumexp.
A dk/dv config with ``FUSE_DQ=1`` instead adds each block's dS·K to an fp32 dq buffer with
atomics inside the dk/dv kernel (no dq kernel: 5 matmuls per block pair instead of 7, as
flash-attention 2); one with ``SPLIT_GROUP=1`` runs a dk/dv program per query head (no loop
over the group, far fewer registers), each writing its own rows of per-query-head dk/dv
buffers that the launcher sums over the group (as flash-attention 2 does for GQA);
`bench_attention.py --tune-first` measures them all.
"""

import triton
import triton.language as tl

from costmodel.kernels.triton_attention_fwd import sequence_block

__all__ = ["attn_bwd_dkdv", "attn_bwd_dq", "attn_bwd_preprocess"]


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
def attn_bwd_preprocess(
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
    dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qt,
                             stride_ot, start_n, diag_hi, seqlen, qk_scale, offs_n, offs_d, dq_base,
                             stride_dqt, True, MASK_BLOCK_M, FUSE_DQ)
    # queries entirely below the diagonal: no causal mask
    dk, dv = _bwd_dkdv_inner(dk, dv, k, v, q_base, do_base, lse_base, delta_base, stride_qt,
                             stride_ot, start_n + BLOCK_N, seqlen, seqlen, qk_scale, offs_n, offs_d,
                             dq_base, stride_dqt, False, BLOCK_M, FUSE_DQ)
    return dk, dv


@triton.jit
def attn_bwd_dkdv(
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
    seq_start, seqlen, start_n = sequence_block(cu_seqlens, BLOCK_N, False)
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
def attn_bwd_dq(
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
    seq_start, seqlen, start_m = sequence_block(cu_seqlens, BLOCK_M, True)
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
    dq = _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kt, stride_vt, start_m,
                       diag_hi, seqlen, qk_scale, offs_m, offs_d, True, MASK_BLOCK_N)
    # keys entirely left of the diagonal: no mask
    dq = _bwd_dq_inner(dq, q, do, lse, delta, k_base, v_base, stride_kt, stride_vt, 0, start_m,
                       seqlen, qk_scale, offs_m, offs_d, False, BLOCK_N)
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
