"""The forward kernel of the Triton varlen attention (`triton_attention`), after the Triton
fused-attention tutorial (tutorials/06-fused-attention.py).

Grid (query block, query head, sequence); a program whose block starts past its sequence's
end exits at once. Each program runs an *off-band* stage over the key blocks strictly below
the diagonal (no mask, no bounds checks: those keys are all inside the sequence) and an
*on-band* stage over the diagonal block (causal mask + key bound). Key blocks above the
diagonal are never visited (loop bounds), so causal attention costs ~half of full attention.
Online softmax in base 2: ``qk_scale = sm_scale · log2(e)`` is folded into the scores so the
kernel calls ``exp2``; the logsumexp (base 2) is saved for the backward pass.
"""

import triton
import triton.language as tl

__all__ = ["attn_fwd", "sequence_block"]


@triton.jit
def sequence_block(cu_seqlens, BLOCK: tl.constexpr, HEAVY_LAST: tl.constexpr):
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
def attn_fwd(
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
    seq_start, seqlen, start_m = sequence_block(cu_seqlens, BLOCK_M, True)
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
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, 0, start_m,
                               seqlen, qk_scale, offs_m, offs_n, offs_d, False, BLOCK_N)
    # on-band: the diagonal block, clipped to the sequence end
    hi = tl.minimum(start_m + BLOCK_M, seqlen)
    acc, l_i, m_i = _fwd_inner(acc, l_i, m_i, q, k_base, v_base, stride_kt, stride_vt, start_m, hi,
                               seqlen, qk_scale, offs_m, offs_n, offs_d, True, BLOCK_N)
    lse = m_i + tl.math.log2(l_i)  # base-2 logsumexp of the scaled scores
    acc = acc / l_i[:, None]
    tl.store(LSE + head * total + seq_start + offs_m, lse, mask=row_mask)
    o_base = Out + seq_start * stride_ot + head * stride_oh
    tl.store(
        o_base + offs_m[:, None] * stride_ot + offs_d[None, :],
        acc.to(Out.dtype.element_ty),
        mask=row_mask[:, None],
    )
