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

    ``cu_seqlens`` [0, 3, 5] gives [0, 1, 2, 0, 1]. No host sync (the output size is given).
    """
    starts = cu_seqlens[:-1].to(torch.int64)
    lengths = cu_seqlens[1:].to(torch.int64) - starts
    seq_start = torch.repeat_interleave(starts, lengths, output_size=total_tokens)
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
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
