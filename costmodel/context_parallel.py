"""A cost model as one rank of a context-parallel group prices a micro-batch.

With context parallelism of size c, one micro-batch of up to c x the per-GPU cap is split
over c GPUs (Megatron and slime: ring attention over chunks of every sequence; verl:
Ulysses, the heads split after an all-to-all). Each GPU holds T / c of its T tokens, so:

- its token-linear part (projections, MLP, LM head) is the curve at T / c tokens, inside
  the calibrated range where T itself would not be. Exact but for padding: Megatron and
  slime pad every sequence to a multiple of 2c (a rank takes chunks r and 2c-1-r of the
  2c), Ulysses the micro-batch to a multiple of c; the padding is not priced (0.3% more
  tokens at c = 8 for RL-like lengths of thousands, 23% for sequences of 1-64 tokens);
- it computes 1 / c of every sequence's attention FLOPs (the 2c-chunk split gives every
  rank exactly L(L+1) / 2c query-key pairs where 2c divides L), priced as that sequence's
  attention over c (at the whole length's efficiency: ring chunks and fewer heads run
  somewhat below it, which no calibration here measures);
- it pays a micro-batch's whole fixed cost (every layer's launches), which therefore
  weighs c times more against the compute than on one GPU.

What the ranks exchange is not in it. Every rank of the group takes about this long (it is
the ranks' mean, and each rank's time where padding makes the split even); the scheduler
balances it over the data-parallel ranks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from costmodel.checks import positive_int
from costmodel.flops import as_lengths
from costmodel.model import checked_csr, separable_microbatch_costs

if TYPE_CHECKING:
    from costmodel.model import CostModel

__all__ = ["ContextParallelCost"]


class ContextParallelCost:
    """`model`'s prices for one rank of a `size`-way context-parallel group (ms), with the
    cost model interface the scheduler takes (`CostModel.for_context_parallel` makes one)."""

    def __init__(self, model: CostModel, size: int) -> None:
        self.model = model
        self.size = positive_int(size, "context-parallel size")  # 0 priced everything inf

    # What the scheduler and the drop-ins read of a cost model, as the model has it.
    @property
    def spec(self) -> Any:
        return self.model.spec

    @property
    def gpu(self) -> str:
        return self.model.gpu

    @property
    def modes(self) -> list[str]:
        return self.model.modes

    @property
    def accepted_shapes(self) -> set[str]:
        return self.model.accepted_shapes

    @property
    def is_estimate(self) -> bool:
        return self.model.is_estimate

    # What the software and GPU checks read (`integrations.args.gpu_mismatch`: the versions
    # and kernels it was timed with, and the shard and sweep `software.calibrate_again` repeats).
    @property
    def extra(self) -> dict:
        return self.model.extra

    @property
    def tensor_parallel(self) -> int:
        return self.model.tensor_parallel

    @property
    def expert_tensor_parallel(self) -> int:
        return self.model.expert_tensor_parallel

    @property
    def provenance(self) -> dict:
        return self.model.provenance

    @property
    def parallel_label(self) -> str:
        """The model's (" at TP 4", or ""), then this view's context parallelism."""
        return f"{self.model.parallel_label}, one GPU of CP {self.size}"

    @property
    def label(self) -> str:
        return f"{self.model.label}, one rank of context parallelism {self.size}"

    def __repr__(self) -> str:
        return f"ContextParallelCost({self.label})"

    # The three parts of a separable cost, per rank.
    def fixed_cost(self, mode: str = "train") -> float:
        return self.model.fixed_cost(mode)

    def sequence_costs(self, lengths: ArrayLike, mode: str = "train") -> np.ndarray:
        return self.model.sequence_costs(lengths, mode) / self.size

    def token_costs(self, tokens: ArrayLike, mode: str = "train") -> np.ndarray:
        return self.model.token_costs(np.asarray(tokens, dtype=np.float64) / self.size, mode)

    def microbatch_costs(self, lengths: ArrayLike, offsets: ArrayLike, mode: str = "train") -> np.ndarray:
        """As `CostModel.microbatch_costs`, for one rank of the group."""
        return separable_microbatch_costs(self, *checked_csr(lengths, offsets), mode)

    def microbatch_cost(self, lengths: ArrayLike, mode: str = "train") -> float:
        L = as_lengths(lengths, "lengths")
        return float(self.microbatch_costs(L, np.array([0, L.size]), mode)[0])
