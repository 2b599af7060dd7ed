"""Mixture-of-experts SwiGLU MLP: router, token grouping, grouped GEMM, weighted scatter.

Per token t (T tokens, E experts, top-k, expert width F):

1. router: ``p = softmax(x_t · W_rᵀ)`` over E (fp32), keep the top-k ``(w, e)``; with
   ``norm_topk_prob`` (Qwen3-MoE, DeepSeek-V3) the k weights are renormalised to sum to 1;
2. group: the T·k (token, expert) pairs are sorted by expert id (stable argsort), giving
   per-expert counts and cumulative offsets; rows of x are gathered in that order;
3. experts: ``silu(x W_gᵉᵀ) * (x W_uᵉᵀ)`` then ``· W_dᵉᵀ`` for each expert's rows, as two
   grouped GEMMs (``torch._grouped_mm`` where it works for the device/dtype, checked once
   per device/dtype at call time; a loop over experts otherwise);
4. scatter: rows go back to (token, slot) order and ``out_t = Σ_k w_k · y_{t,k}``;
5. shared experts (DeepSeek-V3, Qwen2-MoE): a dense SwiGLU MLP of the shared width, added.

With random router weights (N(0, 0.02²)) and RMS-normalised inputs the logits are small and
the top-k choice is near uniform, so expert loads are balanced-ish, as in a trained model
with a load-balancing loss — what timing needs.
"""

from __future__ import annotations

import logging
import numbers

import torch
import torch.nn.functional as F
from torch import nn

from costmodel.checks import positive_int
from costmodel.kernels.mlp import SwiGLUMLP, _check_activation, init_weight, swiglu_activation

__all__ = [
    "GROUPED_GEMM_IMPLS",
    "MoEMLP",
    "group_by_expert",
    "grouped_gemm_available",
    "grouped_linear",
    "moe_reference",
    "route",
]

logger = logging.getLogger(__name__)

#: `grouped_linear` implementations: "auto" picks grouped_mm when it works here.
GROUPED_GEMM_IMPLS: tuple[str, ...] = ("auto", "grouped_mm", "loop")

_GROUPED_MM_OK: dict[tuple[str, int | None, torch.dtype], bool] = {}


def _grouped_mm_fn():
    fn = getattr(torch.nn.functional, "grouped_mm", None)
    return fn if fn is not None else getattr(torch, "_grouped_mm", None)


def grouped_gemm_available(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether torch's grouped GEMM runs forward and backward for `dtype` on `device`.

    Probed once per (device, dtype) with a tiny call including an empty group: the op is
    CUDA/bf16 (sm90+) only on many torch releases, CPU support came later.
    """
    device = torch.device(device)
    key = (device.type, device.index, dtype)
    if key in _GROUPED_MM_OK:
        return _GROUPED_MM_OK[key]
    fn = _grouped_mm_fn()
    ok = False
    if fn is not None:
        # The probe runs a backward: keep autograd on even when called under no_grad or
        # inference_mode (a failed probe would otherwise be cached as "unusable").
        try:
            with torch.inference_mode(False), torch.enable_grad():
                err = _probe_grouped_mm(fn, device, dtype)
            tol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 1e-4
            ok = err <= tol
            if not ok:
                logger.warning("torch grouped GEMM gives wrong results for %s on %s (rel err "
                               "%.1e); MoE experts fall back to a loop", dtype, device, err)
        except Exception as exc:  # a probe must never crash the caller
            # Expected for fp32, or pre-Hopper GPUs on several torch releases.
            log = logger.warning if device.type == "cuda" else logger.info
            first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log("torch grouped GEMM unusable for %s on %s (%s); MoE experts fall back to a "
                "loop over experts", dtype, device, first_line)
    _GROUPED_MM_OK[key] = ok
    return ok


def _probe_grouped_mm(fn, device: torch.device, dtype: torch.dtype) -> float:
    """Largest relative error of a tiny grouped GEMM (with an empty group and group ends that
    are not multiples of 16) against per-group matmuls: output, input and weight gradients."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    a0 = torch.randn(40, 32, generator=gen).to(device, dtype)
    w0 = torch.randn(3, 16, 32, generator=gen).to(device, dtype)
    g0 = torch.randn(40, 16, generator=gen).to(device, dtype)
    offs = torch.tensor([8, 8, 40], device=device, dtype=torch.int32)
    a, w = a0.clone().requires_grad_(), w0.clone().requires_grad_()
    out = fn(a, w.transpose(-2, -1), offs=offs)
    out.backward(g0)
    a64, w64 = a0.double().requires_grad_(), w0.double().requires_grad_()
    ref = torch.cat([a64[:8] @ w64[0].T, a64[8:] @ w64[2].T])
    ref.backward(g0.double())
    if a.grad is None or w.grad is None or a64.grad is None or w64.grad is None:
        return float("inf")  # fn's output did not reach its inputs: no usable kernel

    def rel(x: torch.Tensor, y: torch.Tensor) -> float:
        return ((x.double() - y).norm() / y.norm().clamp_min(1e-30)).item()

    return max(rel(out.detach(), ref.detach()), rel(a.grad, a64.grad), rel(w.grad, w64.grad))


def route(
    x: torch.Tensor, w_router: torch.Tensor, top_k: int, *, norm_topk_prob: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k softmax routing: (weights (T, k), expert ids (T, k) int64).

    The softmax runs in float32 (float64 for float64 inputs); weights come back in it.
    """
    top_k = positive_int(top_k, "top_k")
    if not isinstance(w_router, torch.Tensor) or w_router.dim() != 2:
        raise ValueError(f"w_router must be (num_experts, hidden), got "
                         f"{getattr(w_router, 'shape', w_router)}")
    if top_k > w_router.shape[0]:
        raise ValueError(f"top_k={top_k} > num_experts={w_router.shape[0]} (w_router's rows); "
                         "pick at most num_experts experts per token")
    logits = F.linear(x, w_router)
    probs = logits.to(torch.promote_types(logits.dtype, torch.float32)).softmax(dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def group_by_expert(
    expert_ids: torch.Tensor, num_experts: int, *, check_values: bool = True
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort (token, slot) pairs by expert.

    Returns ``order`` (T·k,) int64: positions in the flattened (T, k) ids, expert-major and
    stable within an expert (so ``order // k`` is the token of each grouped row);
    ``counts`` (E,) int64 rows per expert; ``offsets`` (E,) int32 cumulative group ends
    (the ``offs`` of ``torch._grouped_mm``).

    ``expert_ids``: int64 or int32. ``check_values`` checks every id is in [0, num_experts)
    (a host read: a device sync on GPU, so `MoEMLP`, whose ids come from a top-k over
    num_experts columns, passes False); unchecked out-of-range ids raise an index error on
    CPU and a device-side assert on CUDA.
    """
    num_experts = positive_int(num_experts, "num_experts")
    if not isinstance(expert_ids, torch.Tensor) or expert_ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"expert_ids must be an int64 or int32 tensor, got "
                         f"{getattr(expert_ids, 'dtype', type(expert_ids).__name__)}")
    # int64: scatter_add_ wants int64 indices and a source of the counts' dtype.
    flat = expert_ids.reshape(-1).to(torch.int64)
    if check_values and flat.numel():
        lo, hi = (int(v) for v in torch.aminmax(flat))
        if lo < 0 or hi >= num_experts:
            raise ValueError(f"expert_ids must lie in [0, num_experts={num_experts}), got ids "
                             f"from {lo} to {hi}")
    order = torch.argsort(flat, stable=True)
    # scatter_add_, not bincount: bincount reads the largest id on the host (a device sync,
    # which a CUDA-graph capture of the layer cannot hold).
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    offsets = torch.cumsum(counts, dim=0).to(torch.int32)
    return order, counts, offsets


def grouped_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    offsets: torch.Tensor,
    *,
    impl: str = "auto",
) -> torch.Tensor:
    """Rows ``offsets[e-1]:offsets[e]`` of x (N, in) times ``w[e]ᵀ`` (w: (E, out, in)).

    ``impl``: "grouped_mm" (one grouped GEMM; error if it does not work here), "loop" (one
    GEMM per non-empty expert; reads the offsets on the host), "auto" (grouped_mm when the
    probe passes and the dims are 16-byte aligned, the loop otherwise).
    """
    if impl not in GROUPED_GEMM_IMPLS:
        raise ValueError(f"unknown grouped GEMM impl {impl!r}; allowed: {list(GROUPED_GEMM_IMPLS)}")
    if x.dim() != 2 or w.dim() != 3 or x.shape[1] != w.shape[2]:
        raise ValueError(f"grouped_linear needs x (N, in) and w (E, out, in), got "
                         f"{tuple(x.shape)} and {tuple(w.shape)}")
    if offsets.shape != (w.shape[0],):
        raise ValueError(f"offsets must have one entry per expert ({w.shape[0]}), got "
                         f"{tuple(offsets.shape)}")
    if offsets.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"offsets must be int32 or int64 row ends, got {offsets.dtype}")
    if impl != "loop":
        # grouped_mm wants every row stride 16-byte aligned.
        align = 16 // x.element_size()
        aligned = x.shape[1] % align == 0 and w.shape[1] % align == 0
        usable = aligned and grouped_gemm_available(x.device, x.dtype)
        if impl == "grouped_mm" and not usable:
            raise RuntimeError(
                f"torch grouped GEMM does not work here for {x.dtype} on {x.device} with dims "
                f"({x.shape[1]}, {w.shape[1]}) (needs a torch with torch._grouped_mm for this "
                "device/dtype and 16-byte aligned dims); use impl='loop'"
            )
        if usable:
            # w[e]ᵀ as a transposed view: the (E, in, out) column-major layout cuBLAS wants.
            offs = offsets.to(torch.int32)  # what grouped_mm takes
            return _grouped_mm_fn()(x.contiguous(), w.transpose(-2, -1), offs=offs)
    ends = offsets.tolist()  # checked here, where they are read anyway (the loop's host read)
    if any(b < a for a, b in zip([0, *ends], ends)) or ends[-1:] != [x.shape[0]]:
        raise ValueError(f"offsets must be non-decreasing row ends from 0 to the {x.shape[0]} "
                         f"rows of x, got {ends[:8]}{'...' if len(ends) > 8 else ''}")
    outs, start = [], 0
    for e, end in enumerate(ends):
        if end > start:
            outs.append(F.linear(x[start:end], w[e]))
        start = end
    if not outs:
        return x.new_empty((0, w.shape[1]))
    return torch.cat(outs, dim=0)


class MoEMLP(nn.Module):
    """Top-k routed SwiGLU experts plus optional shared experts (random N(0, 0.02²) init).

    Expert weights are stacked: ``w_gate_up`` (E, 2F, H) gate rows then up rows,
    ``w_down`` (E, H, F); ``w_router`` (E, H).
    """

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        moe_intermediate_size: int,
        *,
        shared_intermediate_size: int = 0,
        norm_topk_prob: bool = True,
        activation: str = "triton",
        grouped_gemm: str = "auto",
        device=None,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        super().__init__()
        _check_activation(activation)
        if grouped_gemm not in GROUPED_GEMM_IMPLS:
            raise ValueError(f"unknown grouped_gemm {grouped_gemm!r}; allowed: "
                             f"{list(GROUPED_GEMM_IMPLS)}")
        # positive_int, not int(): int() truncated top_k=2.5 to 2 and torch refused -1 or 4.0
        # only deep in the weight allocation.
        hidden_size = positive_int(hidden_size, "hidden_size")
        num_experts = positive_int(num_experts, "num_experts")
        top_k = positive_int(top_k, "top_k")
        moe_intermediate_size = positive_int(moe_intermediate_size, "moe_intermediate_size")
        shared_intermediate_size = _shared_width(shared_intermediate_size)
        if top_k > num_experts:
            raise ValueError(f"need 1 <= top_k <= num_experts, got top_k={top_k} with "
                             f"num_experts={num_experts}")
        self.hidden_size = hidden_size
        self.num_experts = num_experts
        self.top_k = top_k
        self.moe_intermediate_size = moe_intermediate_size
        self.norm_topk_prob = bool(norm_topk_prob)
        self.activation = activation
        self.grouped_gemm = grouped_gemm
        kw = {"device": device, "dtype": dtype}
        self.w_router = init_weight(num_experts, hidden_size, **kw)
        self.w_gate_up = init_weight(num_experts, 2 * moe_intermediate_size, hidden_size, **kw)
        self.w_down = init_weight(num_experts, hidden_size, moe_intermediate_size, **kw)
        self.shared = (
            SwiGLUMLP(hidden_size, shared_intermediate_size, activation=activation, **kw)
            if shared_intermediate_size > 0
            else None
        )
        #: Rows per expert in the last forward (a device tensor; for load-balance checks).
        self.last_counts: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise ValueError(f"x must be (tokens, hidden), got {getattr(x, 'shape', x)}")
        if x.shape[1] != self.hidden_size:
            raise ValueError(f"x hidden size {x.shape[1]} != MoE hidden size {self.hidden_size}")
        if x.dtype != self.w_router.dtype:
            raise ValueError(f"x dtype {x.dtype} != MoE weight dtype {self.w_router.dtype}")
        if x.device != self.w_router.device:
            raise ValueError(f"x on {x.device} but MoE weights on {self.w_router.device}")
        tokens, k = x.shape[0], self.top_k
        weights, ids = route(x, self.w_router, k, norm_topk_prob=self.norm_topk_prob)
        # ids come from a top-k over num_experts columns: in range, no check (a device sync).
        order, counts, offsets = group_by_expert(ids, self.num_experts, check_values=False)
        self.last_counts = counts
        xs = x.index_select(0, order // k)  # (T·k, H), expert-major
        h = grouped_linear(xs, self.w_gate_up, offsets, impl=self.grouped_gemm)
        a = swiglu_activation(h, self.activation)
        y = grouped_linear(a, self.w_down, offsets, impl=self.grouped_gemm)
        # Back to (token, slot) order: grouped row j holds flat pair order[j].
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        y = y.index_select(0, inverse).view(tokens, k, self.hidden_size)
        # Σ_k w_k y_k as a batched (1 x k) @ (k x H) GEMM: fp32 accumulation, no atomics.
        out = torch.bmm(weights.to(x.dtype).unsqueeze(1), y).squeeze(1)
        if self.shared is not None:
            out = out + self.shared(x)
        return out

    def extra_repr(self) -> str:
        return (f"hidden={self.hidden_size}, experts={self.num_experts}, top_k={self.top_k}, "
                f"ffn={self.moe_intermediate_size}, activation={self.activation!r}, "
                f"grouped_gemm={self.grouped_gemm!r}")


def _shared_width(value) -> int:
    """The shared-expert width: 0 (no shared experts) or a positive int."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and value == 0:
        return 0
    return positive_int(value, "shared_intermediate_size (0 for no shared experts)")


def moe_reference(moe: MoEMLP, x: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Dense per-token loop over the chosen experts in `dtype` (tests only; slow)."""
    wr = moe.w_router.to(dtype)
    wgu = moe.w_gate_up.to(dtype)
    wd = moe.w_down.to(dtype)
    xf = x.to(dtype)
    f = moe.moe_intermediate_size
    probs = (xf @ wr.T).softmax(dim=-1)
    outs = []
    for t in range(xf.shape[0]):
        w, ids = probs[t].topk(moe.top_k)
        if moe.norm_topk_prob:
            w = w / w.sum()
        acc = torch.zeros(moe.hidden_size, dtype=dtype, device=x.device)
        for wk, e in zip(w, ids.tolist()):
            h = wgu[e] @ xf[t]
            acc = acc + wk * (wd[e] @ (F.silu(h[:f]) * h[f:]))
        if moe.shared is not None:
            s = moe.shared
            ws = s.w_gate_up.to(dtype) if s.fused_gate_up else torch.cat([s.w_gate, s.w_up]).to(dtype)
            h = ws @ xf[t]
            fs = s.intermediate_size
            acc = acc + s.w_down.to(dtype) @ (F.silu(h[:fs]) * h[fs:])
        outs.append(acc)
    return torch.stack(outs)
