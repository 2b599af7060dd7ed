"""SwiGLU MLP: cuBLAS GEMMs through torch, the activation fused in Triton or unfused in torch.

    h   = x @ W_gate_upᵀ            (T, 2F)   one GEMM for gate and up (or two, unfused)
    a   = silu(h[:, :F]) * h[:, F:] (T, F)    the activation: "triton" or "torch"
    out = a @ W_downᵀ               (T, H)

FLOPs (2 per multiply-add): forward 2·T·H·2F + 2·T·F·H = 6·T·H·F; forward+backward 3×
that (`mlp_flops`). The activation is elementwise and not counted.

The Triton kernel lives in `costmodel.kernels.triton_swiglu` and is imported only when the
"triton" activation is used, so this module works with torch alone.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from costmodel.checks import positive_int

__all__ = [
    "ACTIVATIONS",
    "SwiGLUMLP",
    "init_weight",
    "mlp_flops",
    "swiglu_activation",
    "swiglu_activation_reference",
    "swiglu_mlp",
]

#: Implementations of the activation `silu(gate) * up`.
ACTIVATIONS: tuple[str, ...] = ("triton", "torch")

#: Standard deviation of the random weight init (small, never zeros).
INIT_STD = 0.02


def init_weight(
    *shape: int, device=None, dtype: torch.dtype = torch.bfloat16, std: float = INIT_STD
) -> nn.Parameter:
    """A parameter of `shape` drawn from N(0, std²) (from torch's global RNG)."""
    return nn.Parameter(torch.empty(shape, device=device, dtype=dtype).normal_(0.0, std))


def mlp_flops(tokens: int, hidden_size: int, intermediate_size: int, *, backward: bool = False) -> int:
    """FLOPs of a SwiGLU MLP over `tokens`: 6·T·H·F forward, 3× that with backward."""
    fwd = 6 * int(tokens) * int(hidden_size) * int(intermediate_size)
    return 3 * fwd if backward else fwd


def _check_activation(activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; allowed: {list(ACTIVATIONS)}")


def swiglu_activation_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """The unfused torch activation ``F.silu(gate) * up`` (the baseline and the reference)."""
    return F.silu(gate) * up


def swiglu_activation(
    gate_up: torch.Tensor | tuple[torch.Tensor, torch.Tensor], activation: str = "triton"
) -> torch.Tensor:
    """``silu(gate) * up`` for a fused (..., 2F) tensor (gate first) or a (gate, up) pair."""
    _check_activation(activation)
    if isinstance(gate_up, tuple):
        gate, up = gate_up
        if activation == "torch":
            return swiglu_activation_reference(gate, up)
        from costmodel.kernels.triton_swiglu import swiglu

        return swiglu(gate, up)
    if activation == "torch":
        gate, up = gate_up.chunk(2, dim=-1)
        return swiglu_activation_reference(gate, up)
    from costmodel.kernels.triton_swiglu import swiglu_fused

    return swiglu_fused(gate_up)


def _check_mlp_args(x: torch.Tensor, w_gate_up, w_down: torch.Tensor) -> int:
    """Validate the shapes/dtypes/devices of a SwiGLU MLP call; return F."""
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError("x must be a tensor (..., hidden)")
    # A list/tuple is the two-weight form: a one-element list used to pass here and fail
    # later as "not enough values to unpack".
    ws = list(w_gate_up) if isinstance(w_gate_up, (tuple, list)) else [w_gate_up]
    if isinstance(w_gate_up, (tuple, list)) and len(ws) != 2:
        raise ValueError(f"w_gate_up must be one [2F, H] tensor or a (w_gate, w_up) pair, got a "
                         f"{type(w_gate_up).__name__} of {len(ws)}; pass a fused weight bare, "
                         "not in a list")
    hidden = x.shape[-1]
    for w in [*ws, w_down]:
        if not isinstance(w, torch.Tensor) or w.dim() != 2:
            raise ValueError("MLP weights must be 2-D tensors")
        if w.dtype != x.dtype:
            raise ValueError(f"weight dtype {w.dtype} != input dtype {x.dtype}; cast one of them")
        if w.device != x.device:
            raise ValueError(f"weight on {w.device} but input on {x.device}")
    if len(ws) == 1:
        if ws[0].shape[0] % 2 != 0:
            raise ValueError(f"w_gate_up must have 2F rows (gate then up), got {ws[0].shape[0]}")
        ffn = ws[0].shape[0] // 2
    else:
        if ws[0].shape != ws[1].shape:
            raise ValueError(f"w_gate {tuple(ws[0].shape)} and w_up {tuple(ws[1].shape)} differ")
        ffn = ws[0].shape[0]
    if ws[0].shape[1] != hidden:
        raise ValueError(f"input hidden size {hidden} != gate/up weight in-features {ws[0].shape[1]}")
    if tuple(w_down.shape) != (hidden, ffn):
        raise ValueError(f"w_down must be [{hidden}, {ffn}] (hidden, ffn), got {tuple(w_down.shape)}")
    return ffn


def swiglu_mlp(
    x: torch.Tensor,
    w_gate_up: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    w_down: torch.Tensor,
    activation: str = "triton",
) -> torch.Tensor:
    """SwiGLU MLP of ``x`` (..., H): ``w_gate_up`` is [2F, H] (gate rows then up rows) or a
    (w_gate [F, H], w_up [F, H]) pair, ``w_down`` is [H, F]; returns (..., H).
    """
    _check_activation(activation)
    _check_mlp_args(x, w_gate_up, w_down)
    if isinstance(w_gate_up, (tuple, list)):
        w_gate, w_up = w_gate_up
        a = swiglu_activation((F.linear(x, w_gate), F.linear(x, w_up)), activation)
    else:
        a = swiglu_activation(F.linear(x, w_gate_up), activation)
    return F.linear(a, w_down)


class SwiGLUMLP(nn.Module):
    """A SwiGLU MLP with its own weights (random N(0, 0.02²) init).

    ``fused_gate_up=True`` keeps gate and up in one [2F, H] weight (one GEMM, as Megatron's
    ``linear_fc1``); False keeps two [F, H] weights (two GEMMs, as Hugging Face models).
    """

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        *,
        activation: str = "triton",
        fused_gate_up: bool = True,
        device=None,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        super().__init__()
        _check_activation(activation)
        # positive_int: '8' failed as a TypeError on `<`, and int() would truncate 8.5.
        hidden_size = positive_int(hidden_size, "hidden_size")
        intermediate_size = positive_int(intermediate_size, "intermediate_size")
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.activation = activation
        self.fused_gate_up = bool(fused_gate_up)
        kw = {"device": device, "dtype": dtype}
        if self.fused_gate_up:
            self.w_gate_up = init_weight(2 * intermediate_size, hidden_size, **kw)
        else:
            self.w_gate = init_weight(intermediate_size, hidden_size, **kw)
            self.w_up = init_weight(intermediate_size, hidden_size, **kw)
        self.w_down = init_weight(hidden_size, intermediate_size, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.w_gate_up if self.fused_gate_up else (self.w_gate, self.w_up)
        return swiglu_mlp(x, w, self.w_down, self.activation)

    def extra_repr(self) -> str:
        return (f"hidden={self.hidden_size}, ffn={self.intermediate_size}, "
                f"activation={self.activation!r}, fused_gate_up={self.fused_gate_up}")
