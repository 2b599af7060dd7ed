"""A tiny GPT over packed variable-length sequences, built from the benchmarked layer.

The blocks are `costmodel.kernels.layer.TransformerLayer` — the same layer `calibrate`
times and `bench-schedule` measures — so the trainer exercises the real varlen path:
tokens of all a micro-batch's sequences in one (total_tokens, hidden) tensor, attention
kept inside each sequence by ``cu_seqlens``.
"""

from __future__ import annotations

import torch
from torch import nn

from costmodel.kernels.layer import TransformerLayer
from costmodel.spec import ModelSpec

__all__ = ["TinyGPT", "packed_batch"]


class TinyGPT(nn.Module):
    """Embedding, ``spec.num_layers`` transformer layers, final RMSNorm, (tied) LM head."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        attention: str,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        if spec.is_moe or spec.is_mla:
            raise ValueError("the reference trainer builds dense, non-MLA models only")
        self.spec = spec
        self.embed = nn.Embedding(spec.vocab_size, spec.hidden_size, device=device, dtype=dtype)
        nn.init.normal_(self.embed.weight, std=0.02)
        layers = [TransformerLayer(spec, attention=attention, device=device, dtype=dtype)
                  for _ in range(spec.num_layers)]
        for layer in layers:
            # packed_batch builds valid offsets; the per-layer check would read cu_seqlens
            # back to the host, a device sync per layer inside the timed step on a GPU.
            layer.check_values = False
        self.layers = nn.ModuleList(layers)
        self.norm = nn.RMSNorm(spec.hidden_size, device=device, dtype=dtype)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False, device=device, dtype=dtype)
        if spec.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> torch.Tensor:
        """Logits (total_tokens, vocab) for packed token ids (total_tokens,)."""
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, cu_seqlens, max_seqlen)
        return self.lm_head(self.norm(x))


def packed_batch(
    samples: list, *, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Pack token arrays into (ids, targets, cu_seqlens, max_seqlen).

    ``targets[t]`` is the next token of the same sequence, and -100 (ignored) on each
    sequence's last token, so no prediction crosses a sequence boundary.
    """
    lengths = [len(s) for s in samples]
    ids = torch.cat([torch.as_tensor(s, dtype=torch.long) for s in samples])
    targets = torch.cat(
        [torch.cat([torch.as_tensor(s[1:], dtype=torch.long), torch.tensor([-100])]) for s in samples]
    )
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
    return ids.to(device), targets.to(device), cu.to(device), max(lengths)
