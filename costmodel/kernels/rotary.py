"""Rotary position embedding over packed sequences, positions restarting per sequence.

Rotary attention scores depend only on relative positions, so a pack whose positions ran
on across sequences would still attend correctly — but the rotated q/k (what a real
training run computes and what position-dependent variants such as YaRN scale) would not
match. Positions here restart at 0 at every ``cu_seqlens`` boundary, as in a packed
training step.

Convention: the "rotate half" layout of Llama/Qwen (first half of the rotary dims paired
with the second half).
"""

from __future__ import annotations

import torch

__all__ = ["apply_rotary", "positions_from_cu_seqlens", "rotary_cos_sin"]

#: Rotary base (Qwen3/Qwen2.5 use 1e6; the base does not change the cost).
DEFAULT_ROPE_THETA = 1_000_000.0


def positions_from_cu_seqlens(cu_seqlens: torch.Tensor, total_tokens: int) -> torch.Tensor:
    """Position of each packed token within its own sequence: (total_tokens,) int64.

    ``cu_seqlens`` [0, 3, 5] gives [0, 1, 2, 0, 1]. No host sync (the output size is given),
    so the offsets' values are not checked here: on CPU torch notices lengths that do not add
    up to `total_tokens` (a ValueError below); on CUDA it does not, and the positions are
    wrong. Callers validate the offsets first (`validate_cu_seqlens`).
    """
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(f"cu_seqlens must be a 1-D tensor of n + 1 >= 2 offsets, got "
                         f"{getattr(cu_seqlens, 'shape', cu_seqlens)!r}")
    starts = cu_seqlens[:-1].to(torch.int64)
    lengths = cu_seqlens[1:].to(torch.int64) - starts
    try:
        seq_start = torch.repeat_interleave(starts, lengths, output_size=total_tokens)
    except RuntimeError as exc:  # torch's words ("allocated size does not match ...") name no input
        raise ValueError(
            f"cu_seqlens must increase from 0 to total_tokens={total_tokens} (its lengths "
            f"must be positive and add up to it): {exc}"
        ) from None
    return torch.arange(total_tokens, device=cu_seqlens.device) - seq_start


def rotary_cos_sin(
    positions: torch.Tensor,
    rotary_dim: int,
    *,
    theta: float = DEFAULT_ROPE_THETA,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables (T, rotary_dim), computed in float32 then cast to `dtype`."""
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(f"rotary_dim must be even and >= 2, got {rotary_dim}")
    idx = torch.arange(0, rotary_dim, 2, device=positions.device, dtype=torch.float32)
    inv_freq = 1.0 / (theta ** (idx / rotary_dim))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (T, heads, d) by per-token cos/sin (T, d): ``x·cos + rotate_half(x)·sin``."""
    _check_rotary_args(x, cos, sin)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def _check_rotary_args(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Shapes only (metadata, no host sync: this runs twice per layer forward). Broadcasting
    would otherwise hide mistakes: a 2-D x (T, d) became (T, T, d), an odd d paired the
    wrong halves, a one-row table rotated every token by position 0's angles."""
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if x.dim() != 3:
        raise ValueError(f"x must be (tokens, heads, head_dim), got shape {tuple(x.shape)}; "
                         "add a heads dim with x.unsqueeze(1)")
    tokens, head_dim = x.shape[0], x.shape[2]
    if head_dim % 2:
        raise ValueError(f"rotary needs an even head_dim (its two halves are paired), got {head_dim}")
    if cos.shape != (tokens, head_dim) or sin.shape != (tokens, head_dim):
        raise ValueError(
            f"cos and sin must be (tokens, head_dim) = ({tokens}, {head_dim}), one row per "
            f"token of x, got {tuple(cos.shape)} and {tuple(sin.shape)}; build them with "
            "rotary_cos_sin(positions, head_dim) for x's positions"
        )
    if not x.device == cos.device == sin.device:
        raise ValueError(f"x, cos, sin must be on one device, got {x.device}, {cos.device}, "
                         f"{sin.device}")
