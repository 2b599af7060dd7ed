"""Fused SwiGLU activation ``silu(gate) * up`` in Triton: forward, backward, autograd.

The two GEMMs of a SwiGLU MLP run on cuBLAS; what sits between them is elementwise and
memory-bound. Unfused, torch runs it as ``F.silu(g)`` then ``* u`` (two kernels, 5 passes
over (T, F) in the forward, more in the backward plus the copy that joins dgate and dup
into the gradient of the fused gate/up GEMM output). Fused, the forward reads g and u once
and writes the output once (3 passes); the backward reads dout, g, u and writes dgate and
dup straight into one (T, 2F) gradient buffer (5 passes). silu is recomputed in the
backward from g rather than stored, so the forward saves only its input.

Layouts: ``gate`` and ``up`` are 2-D views with unit stride along the feature dim and any
row stride, so the halves of a fused ``(T, 2F)`` GEMM output are read in place without a
copy. Math runs in float32 whatever the storage dtype (fp16, bf16 or fp32).

Derivatives (s = sigmoid(g)):
    out   = g * s * u
    dup   = dout * g * s
    dgate = dout * u * s * (1 + g * (1 - s))          # d/dg [g * s] = s + g s (1 - s)

On CPU the kernels run under the Triton interpreter (``TRITON_INTERPRET=1`` set before
this module is imported); that is for tests only. Importing this module imports triton but
touches no GPU.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from costmodel.kernels.double_backward import first_order_backward

__all__ = [
    "swiglu",
    "swiglu_backward",
    "swiglu_forward",
    "swiglu_fused",
]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# One program handles a BLOCK_M x BLOCK_N tile; ~4K elements per program keeps enough
# bytes in flight per SM for a bandwidth-bound kernel without spilling (fixed, not
# autotuned: calibration must time the same config at every token count).
_TILE_ELEMS = 4096
_MAX_BLOCK_N = 1024
_NUM_WARPS = 8
# CUDA grid limits: axis 0 up to 2**31 - 1 blocks, axis 1 up to 65535.
_GRID0_LIMIT = 2**31 - 1
_GRID1_LIMIT = 65535


@triton.jit
def _swiglu_fwd_kernel(
    g_ptr,
    u_ptr,
    o_ptr,
    stride_g,
    stride_u,
    stride_o,
    n_rows,
    n_cols,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    # int64 row offsets: rows * stride overflows int32 past ~2**31 elements (e.g. 128k
    # tokens x 2 x 12288 features).
    rows64 = rows.to(tl.int64)[:, None]
    g = tl.load(g_ptr + rows64 * stride_g + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + rows64 * stride_u + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    out = g * tl.sigmoid(g) * u
    tl.store(o_ptr + rows64 * stride_o + cols[None, :], out.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(
    do_ptr,
    g_ptr,
    u_ptr,
    dg_ptr,
    du_ptr,
    stride_do,
    stride_g,
    stride_u,
    stride_dg,
    stride_du,
    n_rows,
    n_cols,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows < n_rows)[:, None] & (cols < n_cols)[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    c = cols[None, :]
    do = tl.load(do_ptr + rows64 * stride_do + c, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + rows64 * stride_g + c, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + rows64 * stride_u + c, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(g)  # recomputed, not saved by the forward
    silu = g * sig
    du = do * silu
    dg = do * u * sig * (1.0 + g * (1.0 - sig))
    tl.store(dg_ptr + rows64 * stride_dg + c, dg.to(dg_ptr.dtype.element_ty), mask=mask)
    tl.store(du_ptr + rows64 * stride_du + c, du.to(du_ptr.dtype.element_ty), mask=mask)


# ----------------------------------------------------------------------------- launchers
def _check_runnable(t: torch.Tensor) -> None:
    if t.is_cuda:
        return
    if os.environ.get("TRITON_INTERPRET") == "1":
        return
    raise RuntimeError(
        f"the Triton SwiGLU kernel needs CUDA tensors, got a tensor on {t.device}; use "
        "activation='torch' on CPU, or set TRITON_INTERPRET=1 before triton is imported "
        "(slow; for tests only)"
    )


def _check_2d(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise ValueError(f"{name} must be 2-D (tokens, features), got shape {tuple(t.shape)}")
    if t.dtype not in _DTYPES:
        raise ValueError(
            f"{name} has dtype {t.dtype}; the Triton SwiGLU kernel supports "
            f"{[str(d) for d in _DTYPES]}"
        )
    if t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"{name} must have unit stride along the feature dim, got {t.stride()}")


def _check_pair(gate: torch.Tensor, up: torch.Tensor) -> None:
    _check_2d("gate", gate)
    _check_2d("up", up)
    if gate.shape != up.shape:
        raise ValueError(f"gate and up must have the same shape, got {tuple(gate.shape)}, "
                         f"{tuple(up.shape)}")
    if gate.dtype != up.dtype:
        raise ValueError(f"gate and up must share a dtype, got {gate.dtype}, {up.dtype}")
    if gate.device != up.device:
        raise ValueError(f"gate and up must be on one device, got {gate.device}, {up.device}")
    _check_runnable(gate)


def _launch_config(n_rows: int, n_cols: int) -> tuple[tuple[int, int], int, int]:
    block_n = min(_MAX_BLOCK_N, triton.next_power_of_2(max(n_cols, 1)))
    block_m = max(1, _TILE_ELEMS // block_n)
    grid = (triton.cdiv(n_rows, block_m), triton.cdiv(n_cols, block_n))
    if grid[0] > _GRID0_LIMIT or grid[1] > _GRID1_LIMIT:
        raise ValueError(
            f"SwiGLU input of {n_rows} x {n_cols} needs a {grid[0]} x {grid[1]} grid; the "
            f"limit is {_GRID0_LIMIT} x {_GRID1_LIMIT} blocks of {block_m} x {block_n}"
        )
    return grid, block_m, block_n


def swiglu_forward(
    gate: torch.Tensor, up: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """``silu(gate) * up`` for 2-D gate/up (unit feature stride); returns (or fills) ``out``."""
    _check_pair(gate, up)
    n_rows, n_cols = gate.shape
    if out is None:
        out = torch.empty((n_rows, n_cols), dtype=gate.dtype, device=gate.device)
    elif out.shape != gate.shape or out.dtype != gate.dtype or (n_cols > 1 and out.stride(1) != 1):
        raise ValueError(f"out must be a {tuple(gate.shape)} {gate.dtype} tensor with unit "
                         f"feature stride, got {tuple(out.shape)} {out.dtype} {out.stride()}")
    if out.numel() == 0:
        return out
    grid, block_m, block_n = _launch_config(n_rows, n_cols)
    _swiglu_fwd_kernel[grid](
        gate, up, out,
        gate.stride(0), up.stride(0), out.stride(0),
        n_rows, n_cols,
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=_NUM_WARPS,
    )
    return out


def swiglu_backward(
    dout: torch.Tensor,
    gate: torch.Tensor,
    up: torch.Tensor,
    dgate: torch.Tensor | None = None,
    dup: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradients (dgate, dup) of ``silu(gate) * up`` given ``dout``; fills dgate/dup if given.

    ``dgate``/``dup`` may be the two halves of one (T, 2F) buffer, so the gradient of a fused
    gate/up GEMM output is written in place with no join copy.
    """
    _check_pair(gate, up)
    _check_2d("dout", dout)
    if dout.shape != gate.shape:
        raise ValueError(f"dout shape {tuple(dout.shape)} != gate shape {tuple(gate.shape)}")
    n_rows, n_cols = gate.shape
    if dgate is None:
        dgate = torch.empty_like(gate, memory_format=torch.contiguous_format)
    if dup is None:
        dup = torch.empty_like(up, memory_format=torch.contiguous_format)
    for name, t in (("dgate", dgate), ("dup", dup)):
        if t.shape != gate.shape or t.dtype != gate.dtype or (n_cols > 1 and t.stride(1) != 1):
            raise ValueError(f"{name} must be a {tuple(gate.shape)} {gate.dtype} tensor with unit "
                             f"feature stride, got {tuple(t.shape)} {t.dtype} {t.stride()}")
    if gate.numel() == 0:
        return dgate, dup
    grid, block_m, block_n = _launch_config(n_rows, n_cols)
    _swiglu_bwd_kernel[grid](
        dout, gate, up, dgate, dup,
        dout.stride(0), gate.stride(0), up.stride(0), dgate.stride(0), dup.stride(0),
        n_rows, n_cols,
        BLOCK_M=block_m, BLOCK_N=block_n, num_warps=_NUM_WARPS,
    )
    return dgate, dup


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """Flatten leading dims to rows, keeping a unit feature stride (copy only if needed)."""
    t2 = t.reshape(-1, t.shape[-1])
    if t2.numel() == 0:  # no rows: its strides may be anything (autograd hands (0, 0))
        return t2.new_empty(t2.shape)
    if t2.shape[1] > 1 and t2.stride(1) != 1:
        t2 = t2.contiguous()
    return t2


# ------------------------------------------------------------------------------ autograd
class _SwiGLUFusedFunction(torch.autograd.Function):
    """(..., 2F) -> (..., F): gate is the first half of the last dim, up the second."""

    @staticmethod
    def forward(ctx, gate_up: torch.Tensor) -> torch.Tensor:
        lead = gate_up.shape[:-1]
        gu = _as_rows(gate_up)
        f = gu.shape[1] // 2
        out = swiglu_forward(gu[:, :f], gu[:, f:])
        # The input itself, not its row view: a view made here has no graph, and the
        # double-backward guard needs the input to reach (see first_order_backward).
        ctx.save_for_backward(gate_up)
        ctx.lead = lead
        return out.view(*lead, f)

    @staticmethod
    @first_order_backward("triton swiglu")
    def backward(ctx, saved, dout: torch.Tensor) -> torch.Tensor:
        (gate_up,) = saved
        gu = _as_rows(gate_up)
        f = gu.shape[1] // 2
        do = _as_rows(dout)
        dgu = torch.empty((gu.shape[0], 2 * f), dtype=gu.dtype, device=gu.device)
        swiglu_backward(do, gu[:, :f], gu[:, f:], dgu[:, :f], dgu[:, f:])
        return dgu.view(*ctx.lead, 2 * f)


class _SwiGLUFunction(torch.autograd.Function):
    """Separate gate and up tensors of the same shape (..., F)."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        lead = gate.shape[:-1]
        g, u = _as_rows(gate), _as_rows(up)
        out = swiglu_forward(g, u)
        ctx.save_for_backward(gate, up)  # the inputs, as in _SwiGLUFusedFunction
        ctx.lead = lead
        return out.view(*lead, g.shape[1])

    @staticmethod
    @first_order_backward("triton swiglu")
    def backward(ctx, saved, dout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = saved
        g, u = _as_rows(gate), _as_rows(up)
        dg, du = swiglu_backward(_as_rows(dout), g, u)
        shape = (*ctx.lead, g.shape[1])
        return dg.view(shape), du.view(shape)


def swiglu_fused(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` where ``gate_up[..., :F]`` is gate and ``gate_up[..., F:]`` is up.

    Differentiable; the gradient is one (..., 2F) tensor written by a single kernel.
    """
    if not isinstance(gate_up, torch.Tensor) or gate_up.dim() < 1:
        raise ValueError("gate_up must be a tensor with a feature dim")
    if gate_up.shape[-1] % 2 != 0 or gate_up.shape[-1] == 0:
        raise ValueError(f"gate_up's last dim must be even and positive (gate then up), got "
                         f"{gate_up.shape[-1]}")
    return _SwiGLUFusedFunction.apply(gate_up)


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for two tensors of the same shape. Differentiable."""
    if not isinstance(gate, torch.Tensor) or not isinstance(up, torch.Tensor):
        raise ValueError("gate and up must be torch.Tensors")
    if gate.shape != up.shape:
        raise ValueError(f"gate and up must have the same shape, got {tuple(gate.shape)}, "
                         f"{tuple(up.shape)}")
    if gate.dim() < 1 or gate.shape[-1] == 0:
        raise ValueError(f"gate and up need a positive feature dim, got shape {tuple(gate.shape)}")
    return _SwiGLUFunction.apply(gate, up)
