"""One decoder layer of a ModelSpec over a packed micro-batch, the LM head, random packs.

`TransformerLayer` is the unit calibration and validation time end to end:

    h   = x + W_o · attn(rope(q), rope(k), v)       q, k, v from RMSNorm(x)
    out = h + MLP(RMSNorm(h))                        SwiGLU MLP, or routed experts (MoE)

Attention projections:
- standard / GQA (Llama, Qwen): one fused QKV GEMM to (H_q + 2·H_kv)·head_dim (need not
  equal hidden, as in Qwen3), optional per-head RMSNorm of q and k (`spec.qk_norm`),
  rotary on all of q and k;
- MLA (DeepSeek-V3, `spec.kv_lora_rank > 0`): q through a low-rank down/up projection with
  an RMSNorm between (or directly when `q_lora_rank == 0`); one down projection of x to the
  kv latent plus a rope key shared by all heads; the latent, RMS-normalised, goes up to
  per-head k_nope and v; rotary on the rope parts only; attention on the combined head dim
  (qk_nope + qk_rope for q/k, v_head_dim for v).

Positions restart at 0 for every sequence of the pack (from `cu_seqlens`); attention never
crosses sequences (the backend's contract). Left out, because calibration times them
separately or they do not change the cost shape: sliding windows (the backends have no
window argument; `spec.sliding_window` is ignored here), qkv biases, dropout, the embedding
lookup.

Nothing here touches CUDA at import; parameters go to `device` at construction.
"""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn

from costmodel.kernels.mlp import SwiGLUMLP, init_weight
from costmodel.kernels.moe import MoEMLP
from costmodel.kernels.rotary import apply_rotary, positions_from_cu_seqlens, rotary_cos_sin
from costmodel.spec import as_spec

__all__ = ["LMHead", "TransformerLayer", "check_attention_support", "packed_inputs"]

#: RMSNorm epsilon (Qwen3/Llama use 1e-6/1e-5; it does not change the cost).
RMS_EPS = 1e-6

#: Target id the LM head's loss skips (F.cross_entropy's default ignore_index).
IGNORE_INDEX = -100

#: `attention=` value that skips the attention core (the o-projection consumes q).
NO_ATTENTION = "none"


def _default_activation(device) -> str:
    """The Triton activation on CUDA; torch's on CPU (Triton needs the interpreter there)."""
    return "triton" if device is not None and torch.device(device).type == "cuda" else "torch"


def check_attention_support(attention: str, dtype: torch.dtype, head_dim: int) -> None:
    """At construction, what the backend would refuse only at the first forward."""
    from costmodel.kernels.attention import BACKEND_DTYPES, TRITON_HEAD_DIMS

    allowed = BACKEND_DTYPES[attention]
    if dtype not in allowed:
        raise ValueError(f"attention {attention!r} does not take {dtype}; allowed: "
                         f"{[str(d) for d in allowed]} (attention='none' takes any dtype)")
    if attention == "triton" and head_dim not in TRITON_HEAD_DIMS:
        raise ValueError(f"attention 'triton' supports head dims {list(TRITON_HEAD_DIMS)}, this "
                         f"spec's attention head dim is {head_dim}; use attention='sdpa' or "
                         "'torch-varlen'")


def _check_cu_seqlens(
    cu_seqlens: torch.Tensor, max_seqlen: int, total: int, device: torch.device, *,
    check_values: bool,
) -> None:
    from costmodel.kernels.attention import validate_cu_seqlens

    if isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.device != device:
        raise ValueError(f"cu_seqlens on {cu_seqlens.device} but x on {device}")
    validate_cu_seqlens(cu_seqlens, max_seqlen, total, check_values=check_values)


class TransformerLayer(nn.Module):
    """One decoder layer of `spec` over packed sequences; ``forward(x, cu_seqlens, max_seqlen)``.

    Args:
        spec: the model shape (`costmodel.spec.ModelSpec`, or a preset name / config.json
            path, read by `costmodel.spec.as_spec`).
        attention: a backend name of `costmodel.kernels.attention.get_attention` ("triton",
            "torch-varlen", "sdpa", "flash-attn"), or "none" to skip the attention core so
            the token-linear part (norms, projections, rotary, MLP) can be timed alone.
        moe: True for routed experts, False for the dense MLP, None: MoE iff `spec.is_moe`
            (a dense layer of an MoE model, e.g. DeepSeek-V3's first three, is `moe=False`).
        activation: the SwiGLU activation, "triton" or "torch"; None picks Triton on CUDA.
        grouped_gemm: MoE expert GEMMs, "auto" | "grouped_mm" | "loop".
        device, dtype: where and in what the weights live (random N(0, 0.02²), norms 1).

    Attribute ``check_values`` (default True) reads `cu_seqlens` on the host to validate it
    (a device sync); timing loops that built their inputs with `packed_inputs` set it False.
    """

    def __init__(
        self,
        spec,
        *,
        attention: str = "torch-varlen",
        moe: bool | None = None,
        activation: str | None = None,
        grouped_gemm: str = "auto",
        device=None,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        super().__init__()
        self.spec = spec = as_spec(spec)  # a preset name failed as "'str' has no is_moe"
        self.attention_name = attention
        if attention == NO_ATTENTION:
            self._attn_fn = None
        else:
            from costmodel.kernels.attention import get_attention

            self._attn_fn = get_attention(attention)  # ValueError / RuntimeError if unusable
            # The backend sees the qk head dim (MLA pads v to it), in the layer's dtype.
            check_attention_support(attention, dtype, spec.qk_head_dim)
        self.is_moe = spec.is_moe if moe is None else bool(moe)
        if self.is_moe and not spec.is_moe:
            raise ValueError(f"moe=True but spec {spec.name!r} has no experts (num_experts=0)")
        if not self.is_moe and spec.intermediate_size < 1:
            raise ValueError(f"a dense layer of {spec.name!r} needs intermediate_size >= 1")
        self.activation = _default_activation(device) if activation is None else activation
        self.dtype = dtype
        self.check_values = True
        self.hidden_size = hidden = spec.hidden_size
        self.num_heads = spec.num_heads
        self.is_mla = spec.is_mla
        kw = {"device": device, "dtype": dtype}
        ones = lambda n: nn.Parameter(torch.ones(n, **kw))

        self.input_norm = ones(hidden)
        if self.is_mla:
            self.num_kv_heads = spec.num_heads  # MLA expands the latent to every head
            self.qk_head_dim = spec.qk_nope_head_dim + spec.qk_rope_head_dim
            self.v_head_dim = spec.v_head_dim
            if self.v_head_dim > self.qk_head_dim:
                # `attend` zero-pads v to the qk head dim (one head dim for the backends);
                # a wider v would be cut, and the forward failed on a shape mismatch.
                raise ValueError(
                    f"{spec.name}: v_head_dim={spec.v_head_dim} > qk head dim "
                    f"{self.qk_head_dim} (qk_nope_head_dim + qk_rope_head_dim) is not "
                    "supported: the timed layer pads v up to the qk head dim, so v_head_dim "
                    f"must be at most {self.qk_head_dim}"
                )
            q_out = spec.num_heads * self.qk_head_dim
            if spec.q_lora_rank > 0:
                self.w_q_a = init_weight(spec.q_lora_rank, hidden, **kw)
                self.q_a_norm = ones(spec.q_lora_rank)
                self.w_q_b = init_weight(q_out, spec.q_lora_rank, **kw)
            else:
                self.w_q = init_weight(q_out, hidden, **kw)
            self.w_kv_a = init_weight(spec.kv_lora_rank + spec.qk_rope_head_dim, hidden, **kw)
            self.kv_a_norm = ones(spec.kv_lora_rank)
            self.w_kv_b = init_weight(
                spec.num_heads * (spec.qk_nope_head_dim + spec.v_head_dim), spec.kv_lora_rank, **kw
            )
        else:
            self.num_kv_heads = spec.num_kv_heads
            self.qk_head_dim = self.v_head_dim = spec.head_dim
            qkv_out = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim
            self.w_qkv = init_weight(qkv_out, hidden, **kw)
            if spec.qk_norm:
                self.q_norm = ones(spec.head_dim)
                self.k_norm = ones(spec.head_dim)
        self.w_o = init_weight(hidden, spec.num_heads * self.v_head_dim, **kw)
        self.post_attention_norm = ones(hidden)
        self.mlp: MoEMLP | SwiGLUMLP
        if self.is_moe:
            self.mlp = MoEMLP(
                hidden, spec.num_experts, spec.num_experts_per_tok, spec.moe_intermediate_size,
                shared_intermediate_size=spec.shared_expert_intermediate_size,
                norm_topk_prob=True, activation=self.activation, grouped_gemm=grouped_gemm, **kw,
            )
        else:
            self.mlp = SwiGLUMLP(hidden, spec.intermediate_size, activation=self.activation, **kw)

    # ------------------------------------------------------------------------- pieces
    def _check_inputs(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> None:
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise ValueError(f"x must be (total_tokens, hidden), got {getattr(x, 'shape', x)}")
        if x.shape[1] != self.hidden_size:
            raise ValueError(f"x hidden size {x.shape[1]} != spec hidden_size {self.hidden_size}")
        if x.dtype != self.dtype:
            raise ValueError(f"x dtype {x.dtype} != layer dtype {self.dtype}; cast x or build "
                             f"the layer with dtype={x.dtype}")
        if x.device != self.input_norm.device:
            raise ValueError(f"x on {x.device} but the layer's weights on {self.input_norm.device}")
        _check_cu_seqlens(cu_seqlens, max_seqlen, x.shape[0], x.device,
                          check_values=self.check_values)

    def project_qkv(
        self, h: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (T, H, d_qk), k (T, H_kv, d_qk), v (T, H_kv, d_v) from normed hidden states,
        rotary applied at the given per-token positions."""
        t, heads = h.shape[0], self.num_heads
        if self.is_mla:
            return self._project_mla(h, positions)
        d, kv = self.qk_head_dim, self.num_kv_heads
        q, k, v = F.linear(h, self.w_qkv).split([heads * d, kv * d, kv * d], dim=-1)
        q, k, v = q.view(t, heads, d), k.view(t, kv, d), v.view(t, kv, d)
        if self.spec.qk_norm:
            q = F.rms_norm(q, (d,), self.q_norm, RMS_EPS)
            k = F.rms_norm(k, (d,), self.k_norm, RMS_EPS)
        cos, sin = rotary_cos_sin(positions, d, dtype=h.dtype)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def _project_mla(self, h, positions):
        spec, t, heads = self.spec, h.shape[0], self.num_heads
        nope, rope = spec.qk_nope_head_dim, spec.qk_rope_head_dim
        if spec.q_lora_rank > 0:
            cq = F.rms_norm(F.linear(h, self.w_q_a), (spec.q_lora_rank,), self.q_a_norm, RMS_EPS)
            q = F.linear(cq, self.w_q_b)
        else:
            q = F.linear(h, self.w_q)
        q_nope, q_pe = q.view(t, heads, nope + rope).split([nope, rope], dim=-1)
        ckv, k_pe = F.linear(h, self.w_kv_a).split([spec.kv_lora_rank, rope], dim=-1)
        ckv = F.rms_norm(ckv, (spec.kv_lora_rank,), self.kv_a_norm, RMS_EPS)
        kv = F.linear(ckv, self.w_kv_b).view(t, heads, nope + spec.v_head_dim)
        k_nope, v = kv.split([nope, spec.v_head_dim], dim=-1)
        cos, sin = rotary_cos_sin(positions, rope, dtype=h.dtype)
        q_pe = apply_rotary(q_pe, cos, sin)
        k_pe = apply_rotary(k_pe.unsqueeze(1), cos, sin)  # one rope key shared by all heads
        q = torch.cat([q_nope, q_pe], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(t, heads, rope)], dim=-1)
        return q, k, v

    def attend(self, q, k, v, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        """The attention core: (T, H, d_v). With attention="none", a stand-in of the same
        shape built from q (and, for MLA, k and v) without mixing tokens."""
        dv = self.v_head_dim
        if self._attn_fn is None:
            if self.is_mla:
                # MLA's k/v come from their own projections: feed them into the stand-in so
                # their backward is timed too (standard layers share one QKV GEMM with q).
                return q[..., :dv] + k[..., :dv] + v
            return q
        if self.is_mla and dv != self.qk_head_dim:
            # The backends take one head dim for q, k and v. Zero-padding v to the qk head
            # dim gives output columns [:dv] equal to attention with the true v (the padded
            # columns are exactly 0) at the cost of a wider PV product — slicing them off
            # keeps the result exact. The softmax scale stays 1/sqrt(d_qk), as in MLA.
            v = F.pad(v, (0, self.qk_head_dim - dv))
            out = self._attn_fn(q, k, v, cu_seqlens, max_seqlen, check_values=False)
            return out[..., :dv]
        return self._attn_fn(q, k, v, cu_seqlens, max_seqlen, check_values=False)

    # ------------------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        """x (total_tokens, hidden) packed per `cu_seqlens` (int32, n + 1) -> same shape."""
        self._check_inputs(x, cu_seqlens, max_seqlen)
        t, hidden = x.shape
        positions = positions_from_cu_seqlens(cu_seqlens, t)
        h = F.rms_norm(x, (hidden,), self.input_norm, RMS_EPS)
        q, k, v = self.project_qkv(h, positions)
        attn = self.attend(q, k, v, cu_seqlens, int(max_seqlen))
        x = x + F.linear(attn.reshape(t, -1), self.w_o)
        h = F.rms_norm(x, (hidden,), self.post_attention_norm, RMS_EPS)
        return x + self.mlp(h)

    def extra_repr(self) -> str:
        kind = "moe" if self.is_moe else "dense"
        return (f"spec={self.spec.name!r}, attention={self.attention_name!r}, {kind}, "
                f"mla={self.is_mla}, activation={self.activation!r}")


class LMHead(nn.Module):
    """Final RMSNorm, vocab projection and mean cross-entropy against given targets.

    Logits are cast to float32 for the loss, as training frameworks do (T x V floats: about
    20 GB at 32k tokens x 152k vocab). Targets of -100 (`IGNORE_INDEX`) are skipped; a
    batch with every target skipped has loss 0.

    Attribute ``check_values`` (default True) checks the targets lie in [0, vocab_size) or
    are -100, a host read (a device sync on GPU): timing loops set it False. Unchecked, an
    out-of-range target raises IndexError on CPU and a device-side assert on CUDA.
    """

    def __init__(self, spec, device=None, dtype: torch.dtype = torch.bfloat16) -> None:
        super().__init__()
        self.spec = spec = as_spec(spec)
        self.hidden_size = spec.hidden_size
        self.vocab_size = spec.vocab_size
        self.dtype = dtype
        self.norm = nn.Parameter(torch.ones(spec.hidden_size, device=device, dtype=dtype))
        self.weight = init_weight(spec.vocab_size, spec.hidden_size, device=device, dtype=dtype)
        self.check_values = True

    def random_targets(self, num_tokens: int, *, seed: int | None = None) -> torch.Tensor:
        """Random int64 token ids (num_tokens,) on the head's device."""
        device = self.weight.device
        gen = None if seed is None else torch.Generator(device=device).manual_seed(seed)
        return torch.randint(0, self.vocab_size, (int(num_tokens),), device=device, generator=gen)

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise ValueError(f"x must be (tokens, hidden), got {getattr(x, 'shape', x)}")
        if x.shape[1] != self.hidden_size:
            raise ValueError(f"x hidden size {x.shape[1]} != spec hidden_size {self.hidden_size}")
        if x.dtype != self.dtype:
            raise ValueError(f"x dtype {x.dtype} != head dtype {self.dtype}")
        if x.device != self.weight.device:
            raise ValueError(f"x on {x.device} but the head's weights on {self.weight.device}")
        if not isinstance(targets, torch.Tensor) or targets.shape != (x.shape[0],):
            raise ValueError(f"targets must be ({x.shape[0]},) token ids, got "
                             f"{getattr(targets, 'shape', targets)}")
        if targets.dtype != torch.int64:
            raise ValueError(f"targets must be int64, got {targets.dtype}")
        if targets.device != x.device:
            raise ValueError(f"targets on {targets.device} but x on {x.device}")
        if self.check_values:
            _check_targets(targets, self.vocab_size)
        h = F.rms_norm(x, (self.hidden_size,), self.norm, RMS_EPS)
        logits = F.linear(h, self.weight)
        # Sum over the kept targets / their count (at least 1), not reduction="mean": the same
        # value when some target is kept, but 0 (with zero gradients) instead of mean's 0/0 =
        # NaN when none is. A micro-batch whose tokens are all masked (a prompt-only pack in
        # SFT) is legitimate, and a NaN loss would poison the gradients accumulated over the
        # whole step; an error would stop it. No host sync either way.
        loss = F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum")
        return loss / (targets != IGNORE_INDEX).sum().clamp_min(1)


def _check_targets(targets: torch.Tensor, vocab_size: int) -> None:
    """ValueError unless every target is a token id in [0, vocab_size) or IGNORE_INDEX."""
    bad = (targets != IGNORE_INDEX) & ((targets < 0) | (targets >= vocab_size))
    if bad.any():  # the host read
        first = int(bad.nonzero()[0, 0])
        raise ValueError(f"targets must be token ids in [0, vocab_size={vocab_size}) or "
                         f"{IGNORE_INDEX} (ignored); targets[{first}] = {int(targets[first])}")


def packed_inputs(
    lengths,
    spec,
    *,
    device=None,
    dtype: torch.dtype = torch.bfloat16,
    requires_grad: bool = False,
    seed: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Random hidden states for a pack of sequences: (x, cu_seqlens, max_seqlen).

    x is (Σ lengths, hidden) drawn from N(0, 1); cu_seqlens int32 (n + 1,) on `device`.
    """
    try:
        lens = [operator.index(n) for n in lengths]
    except TypeError:
        raise ValueError(f"lengths must be a sequence of positive ints, got {lengths!r}") from None
    if not lens or min(lens) < 1:
        raise ValueError(f"lengths must be a non-empty sequence of positive ints, got {lengths!r}")
    total = sum(lens)
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    if cu[-1] > 2**31 - 1:
        raise ValueError(f"{total} tokens overflow int32 cu_seqlens")
    gen = None if seed is None else torch.Generator(device=device or "cpu").manual_seed(seed)
    x = torch.randn(total, spec.hidden_size, device=device, dtype=dtype, generator=gen)
    x.requires_grad_(requires_grad)
    cu_seqlens = torch.tensor(cu, dtype=torch.int32, device=device)
    return x, cu_seqlens, max(lens)
